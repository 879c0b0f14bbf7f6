"""A Megatron-Bridge Qwen2.5-VL finetuning recipe fed by our packing task encoder.

    python examples/bridge_recipe.py --data /path/to/energon_dataset        # on a Bridge + Megatron-Core machine
    python examples/bridge_recipe.py --check                                 # anywhere: no GPU, no Megatron-Core

Full mode takes Bridge's ``qwen25_vl_7b_sft_config()`` recipe, replaces its dataset with a provider
over ``BridgeQwenVLPackingTaskEncoder``, applies the settings packed THD rows need, checks them
with ``check_bridge_config`` and runs ``finetune(cfg, forward_step_func=vlm_step.forward_step)``.

``--check`` builds the same settings on a plain config object with Bridge's attribute paths, runs
``check_bridge_config``, streams a few packs from demo shards (written with
``make_demo_shards`` when ``--data`` does not exist yet) and pushes each through Bridge's
``vlm_step.get_batch`` when Bridge's source is importable: normally, or on a CPU machine through
the light import route of ``tests/_bridge_light.py``. Without CUDA, ``Tensor.cuda`` is made the
identity for the check on either route (Bridge's step moves every tensor with ``.cuda()``).

``--tokenizer``: a name (``qwen2.5-vl``, the default, for the preset; see
``energon_pack.load_tokenizer``), a ``tokenizer.json`` or a local Hugging Face
folder. ``--tokenizer demo`` (the offline demo tokenizer) is accepted only for ``--check`` on
demo data (``make_demo_shards`` shards): anything else would train, or judge packs, on ids and
token counts that are not the model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from energon_pack import (
    BridgeQwenVLPackingTaskEncoder,
    ConfigError,
    check_bridge_config,
    describe_tokenizer,
    is_demo_tokenizer,
    load_tokenizer,
    make_bridge_dataset_provider,
)
from energon_pack.integrations.bridge import SPEC_NAMES

PRESET = "qwen2.5-vl"  # the recipe below is Bridge's Qwen2.5-VL 7B SFT

# What packed THD rows need from a Bridge config (attribute path -> value).
SETTINGS = {
    "train.micro_batch_size": 1,  # one THD row per micro-batch; global batch counts packs
    "validation.eval_micro_batch_size": 1,  # validation packs too
    "model.calculate_per_token_loss": True,  # loss summed over tokens, divided by the global token count
    "ddp.average_in_collective": False,
    "model.pipeline_model_parallel_size": 1,
    "model.mtp_num_layers": None,
    "model.cuda_graph_impl": "none",
    "model.overlap_moe_expert_parallel_comm": False,
    "model.delay_wgrad_compute": False,
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="demo_data_bridge", help="Energon dataset (ours or Bridge-prepared ChatML)")
    p.add_argument(
        "--check", action="store_true", help="CPU check: config checks + a few packs through Bridge's get_batch"
    )
    p.add_argument(
        "--tokenizer",
        default=PRESET,
        help=f"tokenizer name ({PRESET!r}: the real Qwen tokenizer), tokenizer.json or local HF folder; "
        "'demo' only with --check on demo data",
    )
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--sp", action="store_true")
    p.add_argument("--packing-buffer-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=200, help="demo samples to write in --check mode")
    p.add_argument("--packs", type=int, default=3, help="packs to stream in --check mode")
    return p.parse_args()


def apply(cfg, settings):
    for path, value in settings.items():
        owner, _, attr = path.rpartition(".")
        obj = cfg
        for part in owner.split("."):
            obj = getattr(obj, part)
        setattr(obj, attr, value)


def is_demo_data(path: Path) -> bool:
    """Demo shards: not prepared yet (``--check`` writes demo shards there) or all named as
    ``make_demo_shards`` names them."""
    if not (path / ".nv-meta").is_dir():
        return True
    shards = list(path.glob("*.tar"))
    return bool(shards) and all(p.name.startswith("demo-") for p in shards)


def load_encoder_tokenizer(args):
    """``--tokenizer`` loaded; the demo tokenizer only for ``--check`` on demo data (ConfigError otherwise)."""
    try:
        tokenizer = load_tokenizer(args.tokenizer, where="--tokenizer")
    except ConfigError as exc:
        fix = (
            exc.fix
            if args.tokenizer == PRESET
            else f"{exc.fix}; or --tokenizer {PRESET} (the default: the real tokenizer)"
        )
        raise ConfigError("--tokenizer", exc.problem, fix) from None
    if is_demo_tokenizer(tokenizer) and not (args.check and is_demo_data(Path(args.data))):
        what = f"--check on {args.data}, which is not demo data" if args.check else "a real run (finetune)"
        raise ConfigError(
            "--tokenizer",
            f"{describe_tokenizer(tokenizer)} cannot drive {what}: its ids mean nothing to the "
            "model and its token counts are not the model's",
            f"pass --tokenizer {PRESET} (the default), a tokenizer.json or a local Hugging Face tokenizer folder; "
            "'demo' is only for --check on demo data",
        )
    return tokenizer


def make_encoder(args):
    return BridgeQwenVLPackingTaskEncoder(
        tokenizer=load_encoder_tokenizer(args),
        preset=PRESET,
        seq_length=args.seq_length,
        cp=args.cp,
        tp=args.tp,
        sp=args.sp,
        pad_to_max_length=True,
    )


def parallel_settings(args):
    """The model's parallel sizes and seq_length: the encoder's knobs under Bridge's names (SPEC_NAMES)."""
    return {path: getattr(args, knob) for path, knob in SPEC_NAMES.items() if path.startswith("model.")}


def print_settings(settings):
    print("Bridge settings for packed THD rows:")
    for path, value in settings.items():
        print(f"  {path} = {value!r}")
    print("  forward_step_func = megatron.bridge.training.vlm_step.forward_step")


def full(args):
    te = make_encoder(args)  # first: a wrong --tokenizer is refused before Bridge is imported
    from megatron.bridge.recipes.qwen_vl.qwen25_vl import qwen25_vl_7b_sft_config
    from megatron.bridge.training.finetune import finetune
    from megatron.bridge.training.vlm_step import forward_step

    cfg = qwen25_vl_7b_sft_config()
    cfg.dataset = make_bridge_dataset_provider(
        args.data, te, packing_buffer_size=args.packing_buffer_size, num_workers=4
    )
    settings = {**SETTINGS, **parallel_settings(args)}
    apply(cfg, settings)
    print_settings(settings)
    check_bridge_config(cfg, te, forward_step_func=forward_step)
    print("check_bridge_config: ok")
    finetune(cfg, forward_step_func=forward_step)


def cpu_cuda_identity():
    """Without CUDA, ``Tensor.cuda`` returns the tensor itself: Bridge's step moves every tensor with
    ``.cuda()``, which a CPU-only torch refuses. For this check only; with CUDA nothing changes."""
    import torch

    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *a, **k: self


def bridge_get_batch():
    """Bridge's ``vlm_step.get_batch_from_iterator`` and how it was imported: normally, else the
    CPU light route of ``tests/_bridge_light.py``; ``(None, reason)`` when neither works."""
    try:
        from megatron.bridge.training.vlm_step import get_batch_from_iterator

        route = "imported normally"
    except Exception as exc:  # Bridge absent, or its package __init__ needs Megatron-Core / TE
        normal_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        try:
            from _bridge_light import bridge_module, bridge_version
        except ImportError:
            return None, f"not importable ({normal_error})"
        if bridge_version() is None:
            return None, f"not installed ({normal_error})"
        get_batch_from_iterator = bridge_module("training.vlm_step").get_batch_from_iterator
        route = "light CPU import (tests/_bridge_light.py)"
    cpu_cuda_identity()
    return get_batch_from_iterator, route


def check(args):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack import BRIDGE_BATCH_KEYS, PADDED_BOUNDARY_KEYS, bridge_dataset_kwargs, make_demo_shards

    te = make_encoder(args)
    get_batch, route = bridge_get_batch()
    print(f"Bridge: {route}")
    ns = SimpleNamespace
    cfg = ns(
        train=ns(), validation=ns(), model=ns(), ddp=ns(), dist=ns(eval_context_parallel_size=None), comm_overlap=None
    )
    settings = {**SETTINGS, **parallel_settings(args)}
    apply(cfg, settings)
    print_settings(settings)
    print(f"tokenizer: {describe_tokenizer(te.tokenizer)}")
    check_bridge_config(cfg, te, allow_demo_tokenizer=True)  # a dry run; make_encoder allowed demo only on demo data
    print("check_bridge_config: ok")

    data = Path(args.data)
    if not (data / ".nv-meta").is_dir():
        make_demo_shards(data, samples=args.samples, per_shard=50)
    ds = get_train_dataset(
        str(data),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=args.packing_buffer_size,
        **bridge_dataset_kwargs(data),
    )
    loader = iter(get_loader(ds))
    for i in range(args.packs):
        batch = next(loader)
        # the padded boundaries are left out when equal to the logical ones (Bridge's own rule)
        missing = set(BRIDGE_BATCH_KEYS) - set(batch) - set(PADDED_BOUNDARY_KEYS)
        assert not missing, missing
        vi = batch["visual_inputs"]
        images = 0 if vi.image_grid_thw is None else int(vi.image_grid_thw.shape[0])
        print(
            f"pack {i}: {len(batch['__keys__'])} samples, {images} images, "
            f"input_ids {tuple(batch['input_ids'].shape)}, "
            f"position_ids {tuple(batch['position_ids'].shape)}, "
            f"visual_inputs {type(vi).__module__}.{type(vi).__name__}"
        )
        if get_batch is not None:
            kept = get_batch(iter([batch]), is_first_pp_stage=True, is_last_pp_stage=True)
            assert kept["input_ids"] is batch["input_ids"] and kept["visual_inputs"] is not None
            assert (kept["visual_inputs"].pixel_values is None) == (vi.pixel_values is None)
    print("through Bridge's get_batch: ok" if get_batch is not None else "Bridge not importable: get_batch not run")


def main():
    args = parse_args()
    try:
        check(args) if args.check else full(args)
    except ConfigError as exc:
        sys.exit(f"bridge_recipe.py: {exc}")


if __name__ == "__main__":
    main()
