"""configure_object_reads on moto's S3 server: range reads (what MSC does for shards above its
whole-object limit) cost several requests per sample; the read-ahead cuts that to a fraction of one,
and every regime gives the same packs as the default whole-shard reads."""

import collections

import botocore.endpoint
import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.errors import ConfigError
from energon_pack.object_reads import configure_object_reads
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference


@pytest.fixture
def requests(monkeypatch):
    """HEAD/GET requests to shard objects (``.tar``) of this process, counted by kind, ranged or not."""
    counts = collections.Counter()
    original = botocore.endpoint.Endpoint.make_request

    def make_request(self, operation_model, request_dict):
        if request_dict.get("url_path", "").endswith(".tar"):
            ranged = "Range" in request_dict.get("headers", {})
            counts[operation_model.name + (" ranged" if ranged else "")] += 1
        return original(self, operation_model, request_dict)

    monkeypatch.setattr(botocore.endpoint.Endpoint, "make_request", make_request)
    yield counts
    configure_object_reads()


def packs(path, n=8):
    """The first ``n`` 2,048-token packs of one in-process pass (in shard order)."""
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=get_preset("qwen2-vl", max_pixels=160 * 28 * 28), seq_length=2048
    )
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    it = iter(get_loader(ds))
    return [next(it) for _ in range(n)]


def test_read_ahead_cuts_range_requests_with_the_same_packs(remote_demo, requests):
    reference = packs(remote_demo)
    samples = sum(len(b["__keys__"]) for b in reference)
    # the shard check's HEAD per shard, then each of the 6 shards opened (a HEAD) and downloaded whole
    assert requests == {"HeadObject": 12, "GetObject": 6}
    regimes = {"range": dict(whole_object_limit=0), "read-ahead": dict(whole_object_limit=0, read_ahead=1 << 20)}
    per_sample = {}
    for name, knobs in regimes.items():
        configure_object_reads(**knobs)
        requests.clear()
        got = packs(remote_demo)
        for a, b in zip(got, reference, strict=True):
            assert batch_difference(a, b) is None
        assert requests["GetObject"] == 0 and requests["HeadObject"] == 12  # no whole download
        per_sample[name] = requests["GetObject ranged"] / samples
    assert per_sample["range"] > 5  # a header and each member: one request each
    assert per_sample["read-ahead"] <= 6 / samples  # one 1 MiB request per shard opened: its first samples
    configure_object_reads()
    requests.clear()
    packs(remote_demo)
    assert requests == {"HeadObject": 12, "GetObject": 6}  # MSC's own behaviour is back


def test_knobs_are_checked():
    with pytest.raises(ConfigError, match="read_ahead: must be a whole number of bytes >= 0, got -1"):
        configure_object_reads(read_ahead=-1)
