"""The Megatron-Bridge paths as a user runs them: the Bridge guide's (and the README's) VLM block,
read from docs/guides/megatron_bridge.md and executed as written, and ``examples/bridge_recipe.py`` in both modes and
on both Bridge import routes.

What is substituted, and why: Bridge's recipe ``qwen25_vl_7b_sft_config()`` cannot be built on
this machine: it imports Megatron-Core and Megatron-LM's training configs (not in this venv, which
holds only Bridge's pure-Python wheel) and downloads the model's Hugging Face config. The tests put
``_bridge_light.qwen25_vl_7b_sft_stand_in`` in its place: the recipe's literal settings, read from
the installed Bridge source, replayed onto namespaces with Bridge's attribute paths (so the
recipe's micro-batch 2, seq_length 4096, TP 2, ``average_in_collective=True`` are what the block
has to change). ``finetune`` is a recorder. Everything else is real: Bridge's ``vlm_step``
(``forward_step``, ``get_batch``), ``DatasetProvider`` and ``EnergonMultiModalDataModule``
through the CPU light import, our encoder, provider and checks. The block's
``load_tokenizer("qwen2.5-vl")`` is the real Qwen tokenizer (built offline) in one test and a
small non-demo tokenizer with Qwen's special-token ids in the others.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import energon_pack
import energon_pack.chat.tokenizer as tokenizer_module
from energon_pack.chat.tokenizer import is_demo_tokenizer, load_demo_tokenizer
from energon_pack.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parents[1]))
from _bridge_light import (  # noqa: E402
    bridge_module,
    bridge_version,
    load_bridge,
    qwen25_vl_7b_sft_stand_in,
    tiny_tokenizer,
)
from _docs import doc_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bridge_recipe.py"
pytestmark = pytest.mark.skipif(
    bridge_version() is None, reason="megatron-bridge wheel not installed (setup.sh installs it)"
)
REAL_TOKENIZER = "qwen2.5-vl"
PARALLEL_KNOBS = {"model.context_parallel_size", "model.tensor_model_parallel_size", "model.sequence_parallel"}


GUIDE = "docs/guides/megatron_bridge.md"  # the README's "Megatron-Bridge" road repeats it verbatim (test_docs.py)


def bridge_block() -> str:
    """The python block of the Megatron-Bridge guide's "Qwen-VL packs through Bridge's VLM step", as written."""
    return doc_block(GUIDE, "Qwen-VL packs through Bridge's VLM step")


BLOCK = bridge_block()


def knobs(err: ConfigError) -> list[str]:
    return [e.knob for e in getattr(err, "errors", [err])]


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    from energon_pack.energon.demo_data import make_demo_shards

    root = tmp_path_factory.mktemp("bridge_readme")
    make_demo_shards(root / "demo_data", samples=200, per_shard=100)
    return root


@pytest.fixture
def bridge(demo_root, monkeypatch):
    """The block's world: cwd with ``demo_data/``, the recipe stand-in, ``finetune`` recorded."""
    load_bridge()
    monkeypatch.chdir(demo_root)
    calls = []
    recipe = types.ModuleType("megatron.bridge.recipes.qwen_vl.qwen25_vl")
    recipe.qwen25_vl_7b_sft_config = qwen25_vl_7b_sft_stand_in
    finetune = types.ModuleType("megatron.bridge.training.finetune")
    finetune.finetune = lambda cfg, forward_step_func: calls.append((cfg, forward_step_func))
    monkeypatch.setitem(sys.modules, recipe.__name__, recipe)
    monkeypatch.setitem(sys.modules, finetune.__name__, finetune)
    return SimpleNamespace(calls=calls, vlm_step=bridge_module("training.vlm_step"), base=bridge_module("data.base"))


def use_tokenizer(monkeypatch, make):
    """``load_tokenizer("qwen2.5-vl")`` returns ``make()``; other names load as usual."""
    real = tokenizer_module.load_tokenizer
    fake = lambda spec=None, **kw: make() if spec == REAL_TOKENIZER else real(spec, **kw)  # noqa: E731
    monkeypatch.setattr(tokenizer_module, "load_tokenizer", fake)
    monkeypatch.setattr(energon_pack, "load_tokenizer", fake)  # the public face the README imports from


def run(code: str) -> dict:
    namespace = {"__name__": "readme_bridge_block"}
    exec(compile(code, f"{GUIDE} (Qwen-VL packs through Bridge's VLM step)", "exec"), namespace)
    return namespace


def assert_finetune_got_a_trainable_config(bridge, ns, monkeypatch):
    """What finetune() receives: the block's config and Bridge's VLM step; the provider builds
    Energon loaders whose packs go through Bridge's own get_batch intact."""
    assert len(bridge.calls) == 1
    cfg, step = bridge.calls[0]
    te = ns["te"]
    assert cfg is ns["cfg"] and step is bridge.vlm_step.forward_step
    assert not is_demo_tokenizer(te.tokenizer)
    assert (
        cfg.train.micro_batch_size,
        cfg.model.seq_length,
        cfg.model.calculate_per_token_loss,
        cfg.ddp.average_in_collective,
    ) == (1, 8192, True, False)
    assert (cfg.model.context_parallel_size, cfg.model.tensor_model_parallel_size, cfg.model.sequence_parallel) == (
        2,
        4,
        True,
    )
    assert (te.packing.seq_length, te.packing.cp, te.packing.tp, te.packing.sp) == (8192, 2, 4, True)
    provider = cfg.dataset
    assert isinstance(provider, bridge.base.DatasetProvider) and provider.task_encoder is te
    assert (provider.path, provider.num_workers, provider.packing_buffer_size, provider.dataloader_type) == (
        "demo_data",
        4,
        64,
        "external",
    )

    provider.num_workers = 0  # the same loader without worker processes, for the test
    train, val, test = provider.build_datasets(
        bridge.base.DatasetBuildContext(train_samples=4, valid_samples=0, test_samples=0)
    )
    assert val is None and test is None
    batch = next(train)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(bridge.vlm_step, "is_pp_first_stage", lambda pp: True)
    monkeypatch.setattr(bridge.vlm_step, "is_pp_last_stage", lambda pp: True)
    tokens, labels, loss_mask, attn, pos, packed, visual = bridge.vlm_step.get_batch(
        iter([batch]), cfg, pg_collection=SimpleNamespace(pp=None)
    )
    assert tokens is batch["input_ids"] and tokens.shape == (1, 8192) and pos.shape == (1, 8192)
    assert labels is batch["labels"] and loss_mask is batch["loss_mask"] and attn is None
    assert packed["cu_seqlens_q_padded"][-1] == 8192 and torch.all(
        packed["cu_seqlens_q_padded"] % 8 == 0
    )  # lcm(2*CP, CP*TP)
    assert type(visual) is bridge_module("training.utils.visual_inputs").GenericVisualInputs
    assert int((tokens == te.tokenizer.special.image_pad).sum()) == (
        0 if visual.image_grid_thw is None else int(visual.image_grid_thw.prod(1).sum()) // 4
    )


# ------------------------------------------------------------------------------ README block
def test_block_is_extracted_from_the_readme():
    assert BLOCK.startswith("from megatron.bridge.recipes.qwen_vl.qwen25_vl import qwen25_vl_7b_sft_config\n")
    assert BLOCK.rstrip().endswith("finetune(cfg, forward_step_func=forward_step)")
    assert 'load_tokenizer("qwen2.5-vl")' in BLOCK and "cfg.model.seq_length = 8192" in BLOCK


def test_readme_block_runs_as_written_with_the_real_tokenizer(bridge, monkeypatch):
    """The one test on the real Qwen tokenizer by name: nothing in the block is replaced but the recipe and finetune."""
    ns = run(BLOCK)
    assert ns["te"].tokenizer.special.image_pad == 151655 and ns["te"].tokenizer.get_vocab_size() == 151665
    assert_finetune_got_a_trainable_config(bridge, ns, monkeypatch)


def test_readme_block_runs_as_written_with_a_stand_in_tokenizer(bridge, monkeypatch):
    use_tokenizer(monkeypatch, tiny_tokenizer)
    ns = run(BLOCK)
    assert_finetune_got_a_trainable_config(bridge, ns, monkeypatch)


def test_recipe_stand_in_carries_what_the_block_must_change():
    """Read from Bridge's recipe source: the values the report says break the old snippet."""
    cfg = qwen25_vl_7b_sft_stand_in()
    assert (
        cfg.train.micro_batch_size,
        cfg.model.seq_length,
        cfg.model.tensor_model_parallel_size,
        cfg.ddp.average_in_collective,
    ) == (2, 4096, 2, True)
    assert cfg.validation.eval_micro_batch_size is None and cfg.model.calculate_per_token_loss is False
    assert (cfg.model.image_token_id, cfg.model.video_token_id, cfg.model.vision_start_token_id) == (
        151655,
        151656,
        151652,
    )


def setting_statements() -> list[tuple[str, list[str]]]:
    """(source, knobs) of every statement of the block that sets ``cfg.<path>`` (not the dataset)."""
    out = []
    for stmt in ast.parse(BLOCK).body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets[0].elts if isinstance(stmt.targets[0], ast.Tuple) else stmt.targets
            paths = [ast.unparse(t) for t in targets]
            if all(p.startswith("cfg.") for p in paths) and paths != ["cfg.dataset"]:
                out.append((ast.get_source_segment(BLOCK, stmt), [p[4:] for p in paths]))
    return out


SETTINGS = setting_statements()


def test_block_sets_what_the_report_names():
    assert [k for _, ks in SETTINGS for k in ks] == [
        "train.micro_batch_size",
        "model.seq_length",
        "model.calculate_per_token_loss",
        "ddp.average_in_collective",
        "model.context_parallel_size",
        "model.tensor_model_parallel_size",
        "model.sequence_parallel",
    ]


@pytest.mark.parametrize("statement, expected", SETTINGS, ids=[", ".join(k) for _, k in SETTINGS])
def test_each_setting_of_the_block_is_needed(bridge, monkeypatch, statement, expected):
    """Leave one setting out and check_bridge_config names exactly that knob; finetune never runs."""
    use_tokenizer(monkeypatch, tiny_tokenizer)
    assert BLOCK.count(statement) == 1
    with pytest.raises(ConfigError) as err:
        run(BLOCK.replace(statement, "pass"))
    extra = ["task_encoder alignment"] if PARALLEL_KNOBS & set(expected) else []
    assert knobs(err.value) == expected + extra
    assert bridge.calls == []


def test_block_with_the_demo_tokenizer_is_refused(bridge, monkeypatch):
    use_tokenizer(monkeypatch, load_demo_tokenizer)
    with pytest.raises(ConfigError) as err:
        run(BLOCK)
    assert knobs(err.value) == ["task_encoder tokenizer"]
    message = str(err.value)
    assert (
        "demo" in message
        and 'tokenizer=load_tokenizer("qwen2.5-vl")' in message
        and "allow_demo_tokenizer=True" in message
    )
    assert bridge.calls == []


def test_block_with_a_tokenizer_of_other_ids_is_refused(bridge, monkeypatch):
    """A real but foreign tokenizer: the model's vision token ids (Bridge's Qwen2.5-VL provider) differ."""
    other = {tok: 300 + i for i, tok in enumerate(tokenizer_module.QWEN_SPECIAL_TOKENS)}
    use_tokenizer(monkeypatch, lambda: tiny_tokenizer(other))
    with pytest.raises(ConfigError) as err:
        run(BLOCK)
    assert knobs(err.value) == [
        "model.image_token_id",
        "model.video_token_id",
        "model.vision_start_token_id",
        "model.vision_end_token_id",
    ]
    assert "is 151655 but the encoder's tokenizer" in str(err.value) and "gives 306" in str(err.value)


def test_block_with_another_encoder_in_the_provider_is_refused(bridge, monkeypatch):
    use_tokenizer(monkeypatch, tiny_tokenizer)
    code = BLOCK.replace(
        "check_bridge_config(cfg, te,",
        "check_bridge_config(cfg, BridgeQwenVLPackingTaskEncoder(tokenizer=te.tokenizer, "
        "preset='qwen2.5-vl', seq_length=8192, cp=2, tp=4, sp=True, pad_to_max_length=True),",
    )
    with pytest.raises(ConfigError) as err:
        run(code)
    assert knobs(err.value) == ["dataset.task_encoder"]


# ------------------------------------------------------------------------------ examples/bridge_recipe.py
def load_example():
    spec = importlib.util.spec_from_file_location("bridge_recipe_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(monkeypatch, *argv):
    example = load_example()
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *argv])
    example.main()
    return example


def test_example_tokenizer_defaults_to_the_real_one(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE)])
    assert load_example().parse_args().tokenizer == REAL_TOKENIZER


def test_example_full_mode_builds_the_recipe_and_calls_finetune(bridge, monkeypatch, tmp_path, capsys):
    path = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(path))
    example = run_example(
        monkeypatch,
        "--data",
        "demo_data",
        "--tokenizer",
        str(path),
        "--cp",
        "2",
        "--tp",
        "2",
        "--sp",
        "--seq-length",
        "2048",
    )
    assert "check_bridge_config: ok" in capsys.readouterr().out
    ((cfg, step),) = bridge.calls
    assert step is bridge.vlm_step.forward_step
    for knob, value in {
        **example.SETTINGS,
        "model.seq_length": 2048,
        "model.context_parallel_size": 2,
        "model.tensor_model_parallel_size": 2,
        "model.sequence_parallel": True,
    }.items():
        owner, _, attr = knob.rpartition(".")
        assert getattr(bridge_module_path(cfg, owner), attr) == value, knob
    te = cfg.dataset.task_encoder
    assert (
        cfg.dataset.path == "demo_data"
        and not is_demo_tokenizer(te.tokenizer)
        and te.tokenizer.special.image_pad == 151655
    )
    assert (te.packing.seq_length, te.packing.cp, te.packing.tp, te.packing.sp) == (2048, 2, 2, True)


def bridge_module_path(cfg, owner):
    for part in owner.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--tokenizer", "demo"], "cannot drive a real run (finetune)"),
        (["--check", "--tokenizer", "demo", "--data", "{mine}"], "which is not demo data"),
        (["--check", "--tokenizer", "{missing}"], "no such file or folder"),
    ],
)
def test_example_refuses_wrong_tokenizers_with_the_fix(bridge, monkeypatch, tmp_path, argv, says):
    mine = tmp_path / "mine"
    (mine / ".nv-meta").mkdir(parents=True)
    (mine / "part-000000.tar").write_bytes(b"")
    argv = [a.format(mine=mine, missing=tmp_path / "nope.json") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        run_example(monkeypatch, *argv)
    message = str(exit_.value.code)
    assert message.startswith("bridge_recipe.py: --tokenizer: ") and says in message
    assert "Fix: " in message and "--tokenizer qwen2.5-vl" in message
    assert bridge.calls == []


def test_example_check_on_the_normal_import_route(tmp_path):
    """Bridge importing normally (here: its modules through their real package paths after the
    light route has stubbed what a CPU machine lacks): --check patches .cuda on this route too and
    pushes demo packs through Bridge's own get_batch."""
    driver = (
        "import runpy, sys, torch\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from _bridge_light import load_bridge\n"
        "load_bridge()\n"
        "from megatron.bridge.training.vlm_step import get_batch_from_iterator  # the import the script tries first\n"
        "if not torch.cuda.is_available():\n"
        "    try:\n"
        "        torch.zeros(1).cuda()\n"
        "    except Exception as exc:\n"
        "        print('without the patch:', exc)\n"
        f"sys.argv = [{str(EXAMPLE)!r}, '--check', '--tokenizer', 'demo', '--data', {str(tmp_path / 'demo')!r},"
        " '--samples', '60', '--packs', '3']\n"
        f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Bridge: imported normally" in out.stdout
    if not torch.cuda.is_available():
        assert "without the patch: Torch not compiled with CUDA enabled" in out.stdout
    assert (
        out.stdout.count("\npack ") == 3
        and "visual_inputs megatron.bridge.training.utils.visual_inputs.GenericVisualInputs" in out.stdout
    )
    assert "through Bridge's get_batch: ok" in out.stdout
