"""A dataset's config that names Python code (a ``part_filter`` / ``sample_loader`` hook, a ``__module__``)
is refused before Energon imports it, unless ENERGON_PACK_ALLOW_DATASET_CODE=1 (issue 45): real loader, real shards."""

import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.energon import compat
from energon_pack.energon.dataset_code import ALLOW_DATASET_CODE_ENV
from energon_pack.energon.demo_data import make_demo_shards
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

HOOK = """\
from pathlib import Path
Path({marker!r}).write_text("imported")

def keep(part):
    return True
"""


@pytest.fixture
def hooked(tmp_path):
    """12 demo samples whose dataset.yaml names ``part_filter: hook.py:keep``; hook.py writes a marker when run."""
    root = make_demo_shards(tmp_path / "ds", samples=12, per_shard=6, seed=3)
    marker = tmp_path / "marker"
    (root / ".nv-meta" / "hook.py").write_text(HOOK.format(marker=str(marker)))
    config = root / ".nv-meta" / "dataset.yaml"
    config.write_text(config.read_text() + "part_filter: hook.py:keep\n")
    return root, marker


def _dataset(path):
    encoder = QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=4096)  # installs the guards
    assert compat.energon_guards_installed()
    return get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=encoder,
        packing_buffer_size=8,
        repeat=False,
    )


def test_a_dataset_hook_is_refused_by_default_and_never_runs(hooked, monkeypatch):
    root, marker = hooked
    monkeypatch.delenv(ALLOW_DATASET_CODE_ENV, raising=False)
    with pytest.raises(ConfigError) as err:
        _dataset(root)
    assert err.value.knob == ALLOW_DATASET_CODE_ENV
    assert str(err.value).startswith(
        f"{ALLOW_DATASET_CODE_ENV}: {root}/.nv-meta/dataset.yaml names part_filter: 'hook.py:keep', Python code "
        f"({root}/.nv-meta/hook.py) that Energon would run in this process"
    )
    assert f"Fix: set {ALLOW_DATASET_CODE_ENV}=1 only for a dataset whose code you trust" in str(err.value)
    assert not marker.exists()


def test_the_opt_in_loads_the_dataset_and_runs_its_hook(hooked, monkeypatch):
    root, marker = hooked
    monkeypatch.setenv(ALLOW_DATASET_CODE_ENV, "1")
    batches = list(get_loader(_dataset(root)))
    assert marker.read_text() == "imported"
    keys = sorted(k for b in batches for k in b["__keys__"])
    assert keys == [f"{i:07d}" for i in range(12)], keys  # no broken sample among the first 12


def test_a_module_named_by_a_dataset_config_is_not_imported(tmp_path, monkeypatch):
    root = make_demo_shards(tmp_path / "ds", samples=6, per_shard=6, seed=3)
    (tmp_path / "evil_dataset_module.py").write_text(f"open({str(tmp_path / 'marker')!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ALLOW_DATASET_CODE_ENV, raising=False)
    (root / ".nv-meta" / "dataset.yaml").write_text("__module__: evil_dataset_module\n__class__: CrudeWebdataset\n")
    with pytest.raises(ConfigError, match=r"names __module__: 'evil_dataset_module' \('CrudeWebdataset'\), code"):
        _dataset(root)
    assert not (tmp_path / "marker").exists()


def test_bench_data_refuses_the_hook_by_name(hooked, monkeypatch, capsys, tmp_path):
    """``energon-pack bench --data`` goes through the same loader: exit 2, the error on stderr, the hook never run."""
    from energon_pack.cli import main

    root, marker = hooked
    monkeypatch.delenv(ALLOW_DATASET_CODE_ENV, raising=False)
    args = ["bench", "--data", str(root), "--buffers", "1", "--modes", "carry", "--workers", "0", "--packs", "1"]
    args += ["--seq-length", "4096", "--tokenizer", "demo", "--no-plots", "--out-dir", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{ALLOW_DATASET_CODE_ENV}: {root}/.nv-meta/dataset.yaml names part_filter: 'hook.py:keep'" in err
    assert not marker.exists()
