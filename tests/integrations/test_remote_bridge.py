"""Megatron-Bridge's dataset provider on a dataset in object storage: Bridge's ChatML layout read
through ``msc://`` gives the same loader kwargs and the same packs as the local copy."""

import dataclasses
import sys
from pathlib import Path

from energon_pack.integrations import bridge as B
from energon_pack.integrations.bridge import provider as bridge_provider

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_integration_bridge import write_bridge_dataset  # noqa: E402

from _bridge_light import bridge_module, load_bridge  # noqa: E402
from harness.loaders import batch_difference  # noqa: E402


def test_provider_reads_a_remote_bridge_dataset_like_the_local_one(s3_store, tmp_path, monkeypatch):
    (tmp_path / "bridge").mkdir()
    local = write_bridge_dataset(tmp_path / "bridge")
    remote = s3_store.upload(local, "bridge")
    monkeypatch.setenv("ENERGON_PACK_CACHE", str(tmp_path / "cache"))
    kwargs = B.bridge_dataset_kwargs(remote)
    assert kwargs == B.bridge_dataset_kwargs(local)
    assert Path(kwargs["dataset_config"]).parent == tmp_path / "cache" / "bridge_dataset_configs"  # never in the bucket
    load_bridge()
    base = bridge_module("data.base")
    monkeypatch.setattr(bridge_provider, "_CLASSES", {})
    first = {}
    for name, path in (("local", local), ("remote", remote)):
        te = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=1024)
        provider = B.make_bridge_dataset_provider(path, te, packing_buffer_size=8, num_workers=0, shuffle_buffer_size=1)
        train, _, _ = provider.build_datasets(
            base.DatasetBuildContext(train_samples=10, valid_samples=0, test_samples=0)
        )
        first[name] = [next(train) for _ in range(2)]
    assert sum(len(b["__keys__"]) for b in first["remote"]) >= 2
    for a, b in zip(first["remote"], first["local"]):
        assert a.keys() == b.keys()
        assert batch_difference(flat(a), flat(b)) is None, batch_difference(flat(a), flat(b))


def flat(batch):
    """The batch with Bridge's visual_inputs dataclass spread into its fields (tensors compare bit for bit)."""
    out = {k: v for k, v in batch.items() if k != "visual_inputs"}
    visual = batch["visual_inputs"]
    out.update({f"visual_inputs.{f.name}": getattr(visual, f.name) for f in dataclasses.fields(visual)})
    return out


def test_missing_remote_dataset_yaml_is_one_config_error(s3_store):
    url = s3_store.url("no-dataset-here")
    try:
        B.bridge_dataset_kwargs(url)
    except B.ConfigError as exc:
        assert exc.problem == f"{url}/.nv-meta/dataset.yaml does not exist"
    else:
        raise AssertionError("no ConfigError")
