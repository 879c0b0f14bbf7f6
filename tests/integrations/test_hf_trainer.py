"""transformers.Trainer (and trl.SFTTrainer) on our packs: PackedIterableDataset, PackedCollator, EnergonStateCallback.

Packs come from the real Energon savable loader over WebDataset shards written here (text and image samples);
tiny random Qwen-VL models (fp32, no downloads) train on the CPU. The Trainer's loss and gradients are compared with
our own step (packed_forward + packed_loss, normalised over the step's supervised tokens); a run stopped at a
checkpoint and resumed trains the same packs (``__keys__``) as an uninterrupted one.
"""

import copy
import io
import json

import numpy as np
import pytest
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from PIL import Image

from _hf_helpers import NO_IMPLICIT_PREPARE, small_preset, tiny_model
from energon_pack.energon import prepare_webdataset
from energon_pack.errors import ConfigError
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = NO_IMPLICIT_PREPARE

WORDS = "pack row token image answer model sample width shard loader".split()


def _jpeg(w, h, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """24 samples: every third with an image, answers of 2-12 words."""
    root = tmp_path_factory.mktemp("trainer_shards")
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "tr-%06d.tar"), maxcount=8, verbose=0) as sink:
        for i in range(24):
            image = i % 3 == 0
            user = ("<image>\n" if image else "") + f"question {i}?"
            answer = " ".join(rng.choice(WORDS, size=2 + i % 11))
            conv = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            fields = {"__key__": f"s{i:02d}", "json": json.dumps(conv).encode()}
            if image:
                fields["0.jpg"] = _jpeg(40 + i, 48, i)
            sink.write(fields)
    prepare_webdataset(root)
    return root


def _loader(root, name, *, workers=0):
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=small_preset(name), seq_length=128)
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        shuffle_buffer_size=8,
        max_samples_per_sequence=4,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers, seed_offset=3),
        task_encoder=te,
        packing_buffer_size=6,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        **H.TRAINER_SETTINGS,
        max_steps=1,
        learning_rate=1e-3,
        max_grad_norm=0.0,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    base.update(kw)
    return transformers.TrainingArguments(**base)


class _Grads(transformers.TrainerCallback):
    """The gradients of the first optimizer step, before the optimizer sees them."""

    grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class _Recording(H.PackedCollator):
    """The collator, recording the ``__keys__`` of every pack it turns into kwargs (the Trainer reads one ahead)."""

    def __init__(self, model):
        super().__init__(model)
        self.keys = []

    def __call__(self, features):
        self.keys.append(list(features[0]["__keys__"]))
        return super().__call__(features)


def _our_step(model, packs):
    """Our own loop's step over ``packs`` (gradient accumulation): the loss sums over the step's supervised tokens."""
    total = sum(int(p["loss_mask"].sum()) for p in packs)
    loss = 0.0
    for p in packs:
        out = H.packed_forward(model, p)
        part, _ = H.packed_loss(out.logits, p, num_supervised_tokens=total)
        part.backward()
        loss += float(part.detach())
    return loss, {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}


@pytest.mark.parametrize(("name", "accumulate"), [("qwen2.5-vl", 1), ("qwen2.5-vl", 2), ("qwen3-vl", 1)])
def test_a_trainer_step_is_our_step(shards, name, accumulate, tmp_path):
    """Trainer + PackedCollator: the same loss and gradients as our step on the same packs, with gradient
    accumulation normalised over the supervised tokens of both packs (num_items_in_batch)."""
    tok = load_demo_tokenizer()
    model = H.prepare_model(tiny_model(name, tok).train())
    ours = copy.deepcopy(model)
    dataset = H.PackedIterableDataset(_loader(shards, name))
    collator = _Recording(model)
    grads = _Grads()
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, gradient_accumulation_steps=accumulate),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[grads],
    )
    result = trainer.train()
    packs = list(zip(range(accumulate), _loader(shards, name)))
    assert [list(p["__keys__"]) for _, p in packs] == collator.keys[:accumulate]
    assert sum(p["num_segments"] for _, p in packs) > accumulate  # packed rows, not single samples
    loss, want = _our_step(ours, [p for _, p in packs])
    assert result.training_loss == pytest.approx(loss, rel=1e-5)
    assert sorted(grads.grads) == sorted(want)
    for key, grad in want.items():
        torch.testing.assert_close(grads.grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)


def test_trainer_labels_are_ours_one_position_later():
    batch = {
        "labels": torch.tensor([[5, 6, -100, 8, 9, -100]]),
        "loss_mask": torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0]]),
    }
    assert H.trainer_labels(batch).tolist() == [[-100, -100, 6, -100, 8, 9]]
    with pytest.raises(ConfigError, match="loss_mask.*other than 0 and 1"):
        H.trainer_labels({**batch, "loss_mask": batch["loss_mask"] * 0.5})
    with pytest.raises(ConfigError, match="labels.*last position is supervised"):
        H.trainer_labels({"labels": torch.tensor([[5, 6]]), "loss_mask": torch.tensor([[0.0, 1.0]])})


def test_the_collator_refuses_batches_of_packs_and_dropped_columns(shards):
    collator = H.PackedCollator(tiny_model("qwen2.5-vl", load_demo_tokenizer()))
    pack = next(iter(_loader(shards, "qwen2.5-vl")))
    with pytest.raises(
        ConfigError, match="per_device_train_batch_size.*got 2 packs.*set per_device_train_batch_size=1"
    ):
        collator([pack, pack])
    with pytest.raises(ConfigError, match="remove_unused_columns.*set remove_unused_columns=False"):
        collator([{"input_ids": pack["input_ids"]}])


def _train(shards, out, steps, *, workers=0, save_steps=None, resume=None):
    """The ``__keys__`` of the packs a Trainer run trained on (2 packs per step: gradient accumulation 2)."""
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train())
    dataset = H.PackedIterableDataset(_loader(shards, "qwen2.5-vl", workers=workers))
    collator = _Recording(model)
    save = dict(save_strategy="steps", save_steps=save_steps) if save_steps else {}
    trainer = transformers.Trainer(
        model=model,
        args=_args(out, max_steps=steps, gradient_accumulation_steps=2, **save),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[H.EnergonStateCallback(dataset)],
    )
    trainer.train(resume_from_checkpoint=resume)
    return collator.keys


@pytest.mark.parametrize("workers", [0, 1])
def test_a_resumed_run_trains_the_packs_of_an_uninterrupted_one(shards, tmp_path, workers):
    """Stopped after step 2 (checkpoint-2 holds the Energon state of the 4 packs trained, not of the one read
    ahead) and resumed: steps 3-4 train the packs of steps 3-4 of an uninterrupted run."""
    full = _train(shards, tmp_path / "full", 4, workers=workers)
    first = _train(shards, tmp_path / "run", 2, workers=workers, save_steps=2)
    state = tmp_path / "run" / "checkpoint-2" / "energon_loader_state_rank0.pt"
    assert state.is_file()
    resumed = _train(shards, tmp_path / "run", 4, workers=workers, resume=str(tmp_path / "run" / "checkpoint-2"))
    assert len(full) == 9 and len(first) == 5 and len(resumed) == 5  # each run reads one pack ahead
    assert first[:4] == full[:4]
    assert resumed[:4] == full[4:8]
    assert len({tuple(k) for k in full[:8]}) == 8


@pytest.mark.parametrize(
    ("knob", "value", "why"),
    [
        ("accelerator_config", {"dispatch_batches": None}, "dispatch slices every tensor of a pack"),
        ("remove_unused_columns", True, "drop the pack's keys"),
        ("dataloader_num_workers", 1, "replay the whole Energon stream"),
    ],
)
def test_arguments_that_break_packs_are_refused_by_name(tmp_path, knob, value, why):
    H.check_trainer_args(_args(tmp_path))
    with pytest.raises(ConfigError, match=f"{knob}.*{why}.*TRAINER_SETTINGS"):
        H.check_trainer_args(_args(tmp_path, **{knob: value}))
