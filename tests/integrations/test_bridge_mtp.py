"""Multi-token prediction on our packs: Megatron-Core's own MTP roll on the batches our Bridge encoder emits.

GPTModel.forward (Megatron-Core >= 0.16) rolls ``labels`` and ``loss_mask`` left once per MTP depth with
``roll_tensor(..., packed_seq_params=)``, which rolls each packed sequence (``cu_seqlens_q``) on its own and
zeroes its last position. Here packs from the real Energon loader on shards the test writes go through
:class:`BridgeQwenVLPackingTaskEncoder`, into the ``PackedSeqParams`` Bridge 0.6.2's VLM step builds from them
(its ``packed_seq_utils.get_packed_seq_params``, the main venv's file, run on real Megatron-Core 0.16.1), and
through Megatron-Core's real ``roll_tensor`` at depths 1 and 2 exactly as GPTModel.forward calls it.

Runs in the compatibility environment ``megatron-bridge-0.3.1`` (Megatron-Core 0.16.1 from PyPI, real, CPU;
``tests/project/test_compat_matrix.py`` runs it); skipped where Megatron-Core is absent (the main venv, where
``tests/integrations/test_integration_bridge.py`` tests ``check_bridge_config``'s MTP rule with stand-ins).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.errors import ConfigError
from energon_pack.integrations import bridge as B
from energon_pack.integrations.bridge import mtp as M

sys.path.insert(0, str(Path(__file__).parents[1]))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron.core") is None,
    reason="needs Megatron-Core: runs in .venv-compat/megatron-bridge-0.3.1 (tests/project/test_compat_matrix.py)",
)

WIDTH = 512


def _main_venv_bridge_file(rel: str) -> Path:
    """A file of the main venv's Megatron-Bridge (0.6.2; the compat env's own Bridge is 0.3.1)."""
    for entry in sys.path:
        path = Path(entry) / "megatron" / "bridge" / rel
        if ".venv-compat" not in entry and path.is_file():
            return path
    raise FileNotFoundError(f"megatron/bridge/{rel} of the main venv's Megatron-Bridge")


@pytest.fixture(scope="module")
def bridge_params():
    """Bridge 0.6.2's VLM-step route from a batch to ``PackedSeqParams``: the keys ``get_batch`` hands on
    (``vlm_step._PACKED_SEQ_PARAM_KEYS``) and ``packed_seq_utils.get_packed_seq_params``, Bridge's own file."""
    step = ast.parse(_main_venv_bridge_file("training/vlm_step.py").read_text())
    names = {}
    for node in step.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                if isinstance(node.value, ast.Tuple):  # (*A, *B, "x")
                    names[node.targets[0].id] = tuple(
                        v
                        for e in node.value.elts
                        for v in (names[e.value.id] if isinstance(e, ast.Starred) else [e.value])
                    )
    keys = names["_PACKED_SEQ_PARAM_KEYS"]
    spec = importlib.util.spec_from_file_location(
        "bridge_0_6_packed_seq_utils", _main_venv_bridge_file("training/utils/packed_seq_utils.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fields = {f.name for f in dataclasses.fields(module.PackedSeqParams)}
    if "total_tokens" not in fields:  # Bridge 0.6.2 is for Megatron-Core >= 0.17, whose params carry total_tokens

        @dataclasses.dataclass
        class PackedSeqParams(module.PackedSeqParams):
            total_tokens: int | None = None  # read by hybrid SSM layers only, never by the MTP roll

        module.PackedSeqParams = PackedSeqParams

    def to_params(batch):
        return module.get_packed_seq_params({k: batch[k] for k in keys if batch.get(k) is not None})

    return to_params


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """40 short ChatML samples (one in four with a small image) in two prepared shards: ten or so segments a pack,
    the assistant's answer last, so supervised tokens reach each segment's end."""
    import io
    import json

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from energon_pack.energon.prepare import prepare_webdataset

    root = tmp_path_factory.mktemp("mtp_shards")
    rng = np.random.default_rng(5)
    with wds.ShardWriter(str(root / "mtp-%06d.tar"), maxcount=20, verbose=0) as sink:
        for i in range(40):
            image = i % 4 == 0
            chat = [
                {
                    "role": "user",
                    "content": ("<image>\n" if image else "") + f"Q{i}" + " why" * int(rng.integers(1, 5)),
                },
                {"role": "assistant", "content": f"A{i}" + " so" * int(rng.integers(1, 9))},
            ]
            fields = {"__key__": f"{i:04d}", "json": json.dumps({"conversations": chat}).encode()}
            if image:
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (28 * (1 + i % 3), 56, 3), dtype=np.uint8)).save(buf, "JPEG")
                fields["0.jpg"] = buf.getvalue()
            sink.write(fields)
    prepare_webdataset(root)
    return root


def bridge_packs(shards, **packing):
    te = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=WIDTH, **packing)
    ds = get_train_dataset(
        str(shards),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    return te, list(get_loader(ds))


def gpt_model_mtp_rolls(labels, loss_mask, params, depths):
    """GPTModel.forward's MTP loop (Megatron-Core 0.16.1, models/gpt/gpt_model.py): one roll of the labels and
    of the loss mask per depth; cp_group None is its path for a CP group of size 1."""
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    mtp_labels, out = labels.clone(), []
    for _ in range(depths):
        mtp_labels, _ = roll_tensor(mtp_labels, shifts=-1, dims=-1, cp_group=None, packed_seq_params=params)
        loss_mask, num_tokens = roll_tensor(loss_mask, shifts=-1, dims=-1, cp_group=None, packed_seq_params=params)
        out.append((mtp_labels, loss_mask, num_tokens))
    return out


def segments(batch):
    """(physical start, real length) of each segment of a Bridge batch (zero-length static entries dropped)."""
    logical = batch["cu_seqlens_q"].tolist()
    physical = batch.get("cu_seqlens_q_padded", batch["cu_seqlens_q"]).tolist()
    return [(physical[i], logical[i + 1] - logical[i]) for i in range(len(logical) - 1) if logical[i + 1] > logical[i]]


def mtp_violations(batch, rolled_labels, rolled_mask, depth):
    """Every way the MTP loss at ``depth`` is wrong on this pack, and the supervised count it should have.

    Right means: a position p carries MTP loss exactly where p + depth is a supervised position of p's own segment,
    its MTP label is the token depth + 1 ahead in that segment, and no gap position carries any."""
    ids, mask = batch["input_ids"][0].tolist(), batch["loss_mask"][0].tolist()
    got_mask, got_labels = rolled_mask[0].tolist(), rolled_labels[0].tolist()
    want = [0.0] * len(mask)
    wrong = []
    for start, length in segments(batch):
        for p in range(start, start + length - depth):
            if mask[p + depth]:
                want[p] = 1.0
                if got_labels[p] != ids[p + depth + 1]:
                    wrong.append(
                        f"position {p}: MTP label {got_labels[p]}, token {depth + 1} ahead {ids[p + depth + 1]}"
                    )
    wrong += [
        f"position {p}: MTP loss mask {g}, should be {w}" for p, (g, w) in enumerate(zip(got_mask, want)) if g != w
    ]
    return wrong, int(sum(want))


@pytest.mark.parametrize(
    "packing",
    [dict(), dict(pad_to_max_length=True), dict(pad_to_max_length=True, pad_cu_seqlens=True, max_segments=16)],
)
def test_megatron_core_masks_mtp_at_our_packed_boundaries(shards, bridge_params, packing):
    """Alignment 1 (no CP, no SP over TP): the roll by Bridge's cu_seqlens_q keeps every MTP target of depth 1 and
    2 inside its segment, the last d tokens of each segment and the fixed-width tail carry none, and the number of
    MTP-supervised tokens is each segment's supervised tokens past its first d positions."""
    from megatron.core.packed_seq_params import PackedSeqParams

    te, batches = bridge_packs(shards, **packing)
    assert te.layout.pad_multiple == 1 and len(batches) >= 3
    counted = {1: 0, 2: 0}
    for batch in batches:
        params = bridge_params(batch)
        assert isinstance(params, PackedSeqParams)
        assert torch.equal(params.cu_seqlens_q, batch["cu_seqlens_q"])
        for depth, (labels, mask, num_tokens) in enumerate(
            gpt_model_mtp_rolls(batch["labels"], batch["loss_mask"], params, depths=2), start=1
        ):
            wrong, expected = mtp_violations(batch, labels, mask, depth)
            assert wrong == []
            assert int(num_tokens) == int(mask.sum()) == expected
            counted[depth] += expected
            tail = int(batch["cu_seqlens_q"][-1])
            assert not mask[0, tail:].any()  # the fixed-width tail
    # no segment's first two tokens are supervised (its prompt comes first), so at depths 1 and 2 every supervised
    # token is still one MTP target, at the position d before its own
    supervised = sum(int(b["loss_mask"].sum()) for b in batches)
    assert [len(segments(b)) for b in batches] == [8] * 5 and supervised == 317
    assert counted == {1: 317, 2: 317}


def test_padded_segments_are_refused_because_megatron_core_0_16_rolls_them_wrong(shards, bridge_params):
    """TP4 + SP pads each segment to a multiple of 4: Megatron-Core 0.16.1 rolls by the unpadded cu_seqlens_q over
    the padded tensor, so MTP targets land on other tokens; rolled by the physical boundaries the same packs
    would be right. check_bridge_config refuses MTP on exactly these packs, naming the version and the fix."""
    te, batches = bridge_packs(shards, tp=4, sp=True, pad_to_max_length=True)
    assert te.layout.pad_multiple == 4
    wrong_under_core, padded_packs = 0, 0
    for batch in batches:
        params = bridge_params(batch)
        padded_packs += int(
            not torch.equal(batch["cu_seqlens_q"], batch["cu_seqlens_q_padded"][: len(batch["cu_seqlens_q"])])
        )
        physical = dataclasses.replace(params, cu_seqlens_q=params.cu_seqlens_q_padded)
        for depth, (labels, mask, _) in enumerate(
            gpt_model_mtp_rolls(batch["labels"], batch["loss_mask"], params, depths=2), start=1
        ):
            wrong_under_core += bool(mtp_violations(batch, labels, mask, depth)[0])
        for depth, (labels, mask, num_tokens) in enumerate(
            gpt_model_mtp_rolls(batch["labels"], batch["loss_mask"], physical, depths=2), start=1
        ):
            wrong, expected = mtp_violations(batch, labels, mask, depth)
            assert wrong == [] and int(num_tokens) == expected
    assert (len(batches), padded_packs, wrong_under_core) == (5, 5, 10)  # every pack wrong at both depths
    cfg = _cfg(tp=4, sp=True)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te, allow_demo_tokenizer=True)
    assert str(err.value) == (
        "model.mtp_num_layers: is 2 on packs aligned to 4 (model.tensor_model_parallel_size=4, "
        "model.sequence_parallel=True): Megatron-Core 0.16.1 rolls the MTP labels and loss mask by the unpadded "
        "cu_seqlens_q over padded segments, so MTP targets land on the wrong tokens. Fix: train MTP with "
        "model.context_parallel_size=1 and model.sequence_parallel=False or model.tensor_model_parallel_size=1 "
        "(alignment 1), or set model.mtp_num_layers=None to train on packs"
    )


def test_check_bridge_config_allows_mtp_where_megatron_core_masks_it(caplog):
    """With the real Megatron-Core 0.16.1 importable: its roll takes packed_seq_params (MTP allowed at
    alignment 1, no warning) and the padded probe fails (so alignment > 1 stays refused)."""
    mcore = M._mcore_mtp_roll()
    assert (mcore.version, mcore.packed) == ("0.16.1", True)
    assert M._mtp_roll_follows_padded_segments(mcore) is False
    with caplog.at_level("WARNING", logger="energon_pack.integrations.bridge"):
        B.check_bridge_config(_cfg())
    assert caplog.records == []


def _cfg(tp=1, sp=False):
    from types import SimpleNamespace

    return SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=1),
        model=SimpleNamespace(
            calculate_per_token_loss=True,
            mtp_num_layers=2,
            context_parallel_size=1,
            tensor_model_parallel_size=tp,
            sequence_parallel=sp,
            seq_length=WIDTH,
        ),
    )
