"""Streaming speed from object storage (issue 26, part 4): the same packs from a local copy and from an
S3-compatible server on 127.0.0.1 (moto, as in the tests), in MSC's two reading regimes.

    .venv/bin/python scripts/bench_object_storage.py [--samples 1200 --per-shard 200 --packs 60 --workers 2]

Regimes (one fresh loader each, the same seed, so the same packs):

- ``local``: the shards on disk.
- ``remote whole-shard``: what MSC does for objects up to its ``memory_load_limit`` (512 MiB): a HEAD,
  then the whole shard in one GET into the worker's memory.
- ``remote range-read``: what MSC does above that limit (multi-GB shards), forced here on small shards:
  every ``read()`` of Energon's tar reader is one ranged GET (tar headers, each member).
- ``remote range-read + read-ahead``: the same through ``energon_pack.object_reads.configure_object_reads(
  whole_object_limit=0, read_ahead=--read-ahead)``: MSC's range reader behind a read-ahead buffer, so a
  sample's members and its neighbours come in one ranged request.

Each regime runs ``--rounds`` times, interleaved (a shared machine's load moves); the best round
counts. Columns: first batch (s), steady samples/s after it, HTTP requests per sample (HEAD + GET, counted
in every worker process through a shared counter), bytes read per byte of the samples used. The
table is printed and the rows written as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "stress")]  # the S3 test server, the harness

REGIMES = ("local", "remote whole-shard", "remote range-read", "remote range-read + read-ahead")


class RequestCounter:
    """HEAD/GET requests and response bytes of botocore, summed over this process and its forked
    loader workers (shared memory created before the workers fork)."""

    def __init__(self) -> None:
        self.requests = multiprocessing.Value("q", 0)
        self.bytes = multiprocessing.Value("q", 0)

    def install(self) -> None:
        import botocore.endpoint

        original = botocore.endpoint.Endpoint.make_request
        counter = self

        def make_request(self, operation_model, request_dict):
            response = original(self, operation_model, request_dict)
            if operation_model.name in ("HeadObject", "GetObject"):
                with counter.requests.get_lock():
                    counter.requests.value += 1
                if operation_model.name == "GetObject":
                    with counter.bytes.get_lock():
                        counter.bytes.value += int(response[0].headers.get("content-length", 0))
            return response

        botocore.endpoint.Endpoint.make_request = make_request

    def reset(self) -> tuple[int, int]:
        values = self.requests.value, self.bytes.value
        self.requests.value = self.bytes.value = 0
        return values


def sample_bytes(folder: Path) -> dict[str, int]:
    """Bytes each sample takes in its shard (its members with their tar headers), by key."""
    sizes: dict[str, int] = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key = member.name.split(".", 1)[0]
                sizes[key] = sizes.get(key, 0) + 512 + -(-member.size // 512) * 512
    return sizes


def run(path: str, packs: int, workers: int, width: int) -> dict:
    """First-batch latency, steady samples/s and the sample keys of ``packs`` packs."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
    from harness.loaders import close

    te = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=get_preset("qwen2-vl", max_pixels=160 * 28 * 28), seq_length=width
    )
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=16,
        repeat=True,
    )
    start = time.perf_counter()
    loader = get_savable_loader(ds)
    it = iter(loader)
    keys = list(next(it)["__keys__"])
    first = time.perf_counter()
    steady = 0
    for _ in range(packs - 1):
        batch = next(it)
        keys += batch["__keys__"]
        steady += len(batch["__keys__"])
    end = time.perf_counter()
    close(loader)
    return {"first_batch_s": first - start, "steady_samples_per_s": steady / (end - first), "keys": keys}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--per-shard", type=int, default=200)
    parser.add_argument("--packs", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--read-ahead", type=int, default=1 << 20, help="bytes per ranged request with read-ahead")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per regime (best counts)")
    parser.add_argument("--out", default="bench_results/object_storage.json")
    args = parser.parse_args(argv)

    from _s3_server import s3_server
    from energon_pack.energon.demo_data import make_demo_shards
    from energon_pack.object_reads import configure_object_reads

    counter = RequestCounter()
    counter.install()
    with tempfile.TemporaryDirectory() as tmp, s3_server(tmp) as store:
        local = make_demo_shards(Path(tmp) / "demo", samples=args.samples, per_shard=args.per_shard, seed=0)
        remote = store.upload(local, "demo")
        sizes = sample_bytes(local)
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name in REGIMES:
                configure_object_reads(
                    whole_object_limit=0 if "range" in name else None,
                    read_ahead=args.read_ahead if "read-ahead" in name else 0,
                )
                counter.reset()
                result = run(str(local) if name == "local" else remote, args.packs, args.workers, args.width)
                requests, read = counter.reset()
                keys = result.pop("keys")
                used = sum(sizes[k] for k in keys)
                row = best.setdefault(
                    name,
                    {
                        "regime": name,
                        "first_batch_s": float("inf"),
                        "steady_samples_per_s": 0.0,
                        "samples": len(keys),
                        "keys": keys,
                        "requests": requests,
                        "requests_per_sample": round(requests / len(keys), 2),
                        "bytes_read_per_byte_used": round(read / used, 2) if read else None,
                    },
                )
                row["first_batch_s"] = round(min(row["first_batch_s"], result["first_batch_s"]), 3)
                row["steady_samples_per_s"] = round(max(row["steady_samples_per_s"], result["steady_samples_per_s"]), 1)
                assert keys == row["keys"], f"{name}: another sample order in a later round"
        configure_object_reads()
    rows, reference = list(best.values()), best["local"]["keys"]
    for row in rows:
        row["same_samples_as_local"] = row.pop("keys") == reference
    base = rows[0]
    for row in rows:
        row["steady_vs_local"] = round(row["steady_samples_per_s"] / base["steady_samples_per_s"], 2)
        row["first_batch_vs_local"] = round(row["first_batch_s"] / base["first_batch_s"], 2)
    print(f"{'regime':32} {'1st batch':>9} {'x local':>7} {'smp/s':>7} {'x local':>7} {'req/smp':>7} {'read/used':>9}")
    for r in rows:
        ratio = "-" if r["bytes_read_per_byte_used"] is None else f"{r['bytes_read_per_byte_used']:.2f}"
        print(
            f"{r['regime']:32} {r['first_batch_s']:8.2f}s {r['first_batch_vs_local']:7.2f} "
            f"{r['steady_samples_per_s']:7.1f} {r['steady_vs_local']:7.2f} {r['requests_per_sample']:7.2f} {ratio:>9}"
        )
    result = {"context": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
