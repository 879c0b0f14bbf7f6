"""The ``energon-pack`` command line: demo, data conversion and preparation, benchmarks, JSONL inspection, stress report.

Errors a user can make (a wrong path, an unprepared dataset, a bad number, a configuration
mistake) print one line on stderr with the next step and exit with status 2; ``--debug``
shows the traceback instead. Ctrl-C stops any command at once with exit status 130, keeping
what was already written (``bench`` writes each finished cell).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

DEMO_DIR = "demo_data"
PRESET_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
RAW_SUFFIXES = (".json", ".jsonl", ".parquet")


class CliError(Exception):
    """A user error: printed as one line (``energon-pack CMD: error: ...``), exit status 2."""


# ------------------------------------------------------------------------------------ datasets
def dataset_kind(path: str | Path) -> str:
    """What ``path`` holds: ``missing``, ``prepared`` (``.nv-meta/dataset.yaml``), ``prepared_jsonl``
    (a ``.jsonl`` with Energon's ``.idx``), ``raw`` (JSON / JSONL / Parquet file, or a folder with
    such files), ``shards`` (``*.tar`` not prepared), ``empty`` (an empty folder) or ``unusable``.
    An ``msc://`` path is looked at in object storage (:func:`remote_dataset_kind`)."""
    from energon_pack.storage import is_remote

    if is_remote(path):
        return remote_dataset_kind(str(path))
    path = Path(path)
    if not path.exists():
        return "missing"
    if path.is_file():
        if path.suffix == ".jsonl" and Path(str(path) + ".idx").exists():
            return "prepared_jsonl"
        return "raw" if path.suffix.lower() in RAW_SUFFIXES else "unusable"
    if (path / ".nv-meta" / "dataset.yaml").is_file():
        return "prepared"
    if not any(path.iterdir()):
        return "empty"
    if next(path.rglob("*.tar"), None) is not None:
        return "shards"
    if any(p.suffix.lower() in RAW_SUFFIXES for p in path.iterdir() if p.is_file()):
        return "raw"
    return "unusable"


def remote_dataset_kind(url: str) -> str:
    """:func:`dataset_kind` of an object-storage path: a file is one object; a folder is a prefix, and
    one without objects is ``missing`` (object stores have no empty folders). One HEAD and, for a
    prefix, one listing."""
    from energon_pack.storage import epath, list_names, store_errors

    with store_errors(url):
        if epath(url).is_file():
            if url.endswith(".jsonl") and epath(url + ".idx").is_file():
                return "prepared_jsonl"
            return "raw" if url.lower().endswith(RAW_SUFFIXES) else "unusable"
        names = list_names(url)
    if ".nv-meta/dataset.yaml" in names:
        return "prepared"
    if not names:
        return "missing"
    if any(n.endswith(".tar") for n in names):
        return "shards"
    return "raw" if any("/" not in n and n.lower().endswith(RAW_SUFFIXES) for n in names) else "unusable"


def raw_sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in RAW_SUFFIXES)


def require_prepared(path: str | Path, *, jsonl_ok: bool = False) -> str | Path:
    """``path`` if it is a prepared Energon dataset (an ``msc://`` one as the string); otherwise a
    :class:`CliError` naming the command that fixes it. Never writes anything."""
    from energon_pack.storage import is_remote

    kind = dataset_kind(path)
    if kind == "prepared" or (jsonl_ok and kind == "prepared_jsonl"):
        return str(path) if is_remote(path) else Path(path)
    if is_remote(path):
        raise CliError(f"{path} is not a prepared Energon dataset in object storage (it {REMOTE_KIND[kind]}): "
                       f"point --data at the prefix that holds .nv-meta/dataset.yaml (prepare shards there with "
                       f"`energon-pack prepare {path}`)")
    path = Path(path)
    if kind == "missing":
        hint = (f"`energon-pack make-demo {path}` writes demo data there" if str(path) == DEMO_DIR
                else "check the path, or write demo data with `energon-pack make-demo DIR`")
        raise CliError(f"{path} does not exist: {hint}")
    if kind == "shards":
        raise CliError(f"{path} holds *.tar shards but is not a prepared Energon dataset (no .nv-meta/dataset.yaml): "
                       f"run `energon-pack prepare {path}` first")
    if kind in ("raw", "prepared_jsonl"):
        src = raw_sources(path)
        name = src[0] if len(src) == 1 else path
        what = "a JSONL file prepared for the text encoder" if kind == "prepared_jsonl" else "raw JSON/JSONL/Parquet data"
        raise CliError(f"{path} is {what}, not an Energon WebDataset: run `energon-pack convert {name} OUT` "
                       f"and pass --data OUT")
    if kind == "empty":
        raise CliError(f"{path} is an empty folder: convert your data into it with `energon-pack convert SOURCE {path}`, "
                       f"or write demo data with `energon-pack make-demo {path}`")
    raise CliError(f"{path} holds no Energon dataset, *.tar shards or JSON/JSONL/Parquet data: point --data at a "
                   f"folder prepared with `energon-pack convert` or `energon-pack prepare`")


#: the arguments that name what a command writes (reports, packs): local paths only
OUTPUT_ARGS = ("out", "out_dir", "json_out", "cache_dir")

#: what a remote path holds, for messages (the kinds of :func:`remote_dataset_kind`)
REMOTE_KIND = {"missing": "holds no object", "prepared_jsonl": "is a prepared JSONL file",
               "raw": "holds raw JSON/JSONL/Parquet data", "shards": "holds *.tar shards without .nv-meta/dataset.yaml",
               "unusable": "holds no shards", "prepared": "is a prepared dataset"}


def refuse_remote_output(path: Any, what: str) -> None:
    """A :class:`CliError` when ``path`` (something a command would write) is in object storage."""
    from energon_pack.storage import is_remote

    if path is not None and is_remote(path):
        raise CliError(f"{path}: {what} is written to local disk only, not to object storage: pass a local path "
                       f"(and copy the result with your storage tools)")


def demo_dataset(path: str | Path, samples: int) -> str | Path:
    """``energon-pack demo``: a prepared dataset is used as is (also one in object storage); demo data
    is written only into a local folder that is absent or empty; any other folder is refused (see
    :func:`require_prepared`)."""
    from energon_pack.storage import is_remote

    kind = dataset_kind(path)
    if is_remote(path) and kind != "prepared":
        raise CliError(f"{path} is not a prepared dataset (it {REMOTE_KIND[kind]}) and demo data is written to local "
                       f"disk only: write it with `energon-pack make-demo DIR`, copy DIR (with .nv-meta/) there and "
                       f"pass --data {path}")
    if not is_remote(path):
        path = Path(path)
    if kind in ("missing", "empty"):
        from energon_pack.energon.demo_data import make_demo_shards

        print(f"writing {samples} demo samples to {path}/ ...", flush=True)
        make_demo_shards(path, samples)
        return path
    return require_prepared(path)


def ensure_demo_data(path: str | Path, samples: int) -> str | Path:  # kept for callers of the old name
    return demo_dataset(path, samples)


# ------------------------------------------------------------------------------------ tokenizers
def load_tokenizer(spec: str | None, default: str = "qwen2.5-vl") -> tuple[Any, str]:
    """(tokenizer, description) for ``--tokenizer``: None -> the real tokenizer named ``default`` (a
    Qwen-VL name, built offline); ``demo`` -> the shipped demo tokenizer; a Qwen-VL name, a
    ``tokenizer.json`` file or a local Hugging Face folder otherwise. Never downloads."""
    from energon_pack.chat.tokenizer import describe_tokenizer, is_demo_tokenizer, qwen_vocab_version
    from energon_pack.chat.tokenizer import load_tokenizer as load

    tok = load(spec or default, where="--tokenizer")
    if is_demo_tokenizer(tok):
        return tok, f"demo tokenizer ({tok.inner.get_vocab_size()} tokens; lengths are not your model's)"
    if qwen_vocab_version(tok) is not None:
        return tok, describe_tokenizer(tok)
    size = tok.get_vocab_size() if hasattr(tok, "get_vocab_size") else len(tok)
    return tok, f"{spec} ({size} tokens)"


# ------------------------------------------------------------------------------------ argument types
def _int_at_least(minimum: int):
    """An argparse type: a whole number >= ``minimum``, with a one-line message otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    parse.__name__ = "positive int" if minimum == 1 else f"int >= {minimum}"
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(_positive_int(x.strip()) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one number, e.g. 8,32,64")
    return values


def _split(text: str) -> tuple[float, float, float]:
    """``train[,val[,test]]`` shard ratios; missing parts are 0."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give train,val,test ratios, e.g. 0.9,0.1,0") from None
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to 3 non-negative ratios (train,val,test) with a positive "
                                         f"sum, e.g. 0.9,0.1,0")
    values += [0.0] * (3 - len(values))
    return tuple(values)  # type: ignore[return-value]


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ("carry", "rounds")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: modes are carry and/or rounds, e.g. carry,rounds")
    return modes


# ------------------------------------------------------------------------------------ parser
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help; flags say "off"; a help text that already names its
    default in words is left alone."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is argparse.SUPPRESS or "default" in text or action.option_strings == []:
            return text
        if action.default is None:
            return text + " (default: none)"
        if action.default is False:
            return text + " (default: off)"
        if isinstance(action.default, tuple):
            return text + f" (default: {','.join(map(str, action.default))})"
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("energon-pack")
    except Exception:
        from energon_pack import __version__

        return __version__


def object_read_options(p: argparse.ArgumentParser) -> None:
    """How shards in object storage are read (``energon_pack.object_reads``; msc:// datasets only)."""
    p.add_argument("--whole-object-limit", type=_non_negative_int, default=None,
                   help="msc:// shards up to this many bytes are downloaded whole, larger ones range-read "
                        "(default: multi-storage-client's 512 MiB)")
    p.add_argument("--read-ahead", type=_non_negative_int, default=0,
                   help="bytes each range read of an msc:// shard asks for at least (e.g. 1048576: a sample and its "
                        "neighbours in one request; 0: one request per read, multi-storage-client's own)")


@contextlib.contextmanager
def object_reads(args: argparse.Namespace) -> Iterator[None]:
    """``--whole-object-limit`` / ``--read-ahead`` while the command runs (MSC's own reads again after)."""
    if getattr(args, "whole_object_limit", None) is None and not getattr(args, "read_ahead", 0):
        yield
        return
    from energon_pack.object_reads import configure_object_reads

    configure_object_reads(whole_object_limit=args.whole_object_limit, read_ahead=args.read_ahead)
    try:
        yield
    finally:
        configure_object_reads()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="energon-pack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"energon-pack {_version()}")
    parser.add_argument("--debug", action="store_true", default=False, help="show tracebacks instead of one-line errors")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error (default: off: a one-line message, exit status 2)")
    common.add_argument("--cache-dir", default=None,
                        help="folder for caches (JSONL line index and lengths, the built Qwen tokenizer); "
                             "default: $ENERGON_PACK_CACHE_DIR, else $XDG_CACHE_HOME/energon_pack, else "
                             "~/.cache/energon_pack (never next to your data)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common], formatter_class=_HelpFormatter, **kw)

    demo = add("demo", "make demo shards if absent, stream packed batches (carry vs rounds), report")
    demo.add_argument("--data", default=DEMO_DIR,
                      help="dataset folder: demo data is written into it when it is absent or empty; "
                           "a prepared Energon dataset is used as is; anything else is refused")
    demo.add_argument("--samples", type=_positive_int, default=1200, help="demo samples to write when creating it")
    demo.add_argument("--buffer", type=_positive_int, default=64, help="packing_buffer_size K (samples per worker)")
    demo.add_argument("--workers", type=_non_negative_int, default=2, help="loader worker processes (0: in this process)")
    demo.add_argument("--packs", type=_positive_int, default=150, help="packs to stream per mode (at least 1)")
    demo.add_argument("--width", type=_positive_int, default=8192, help="pack width in tokens (seq_length)")
    demo.add_argument("--out", default="bench_results/demo.json", help="JSON report path")
    object_read_options(demo)

    make = add("make-demo", "write demo ChatML WebDataset shards into a new or empty folder and prepare them for Energon")
    make.add_argument("dir", help="output folder (new, empty, or an earlier make-demo output)")
    make.add_argument("--samples", type=_positive_int, default=1200, help="number of demo samples")
    make.add_argument("--seed", type=int, default=0, help="random seed (the same seed writes the same bytes)")

    sub.add_parser(
        "convert", add_help=False,
        help="your LLaVA/ShareGPT/OpenAI-messages/LLaMA-Factory (alpaca, tool calls) JSON(L) or Parquet -> prepared "
             "Energon shards (see convert --help)")

    prep = add("prepare", "energon prepare, non-interactive: a folder of *.tar shards or a .jsonl file")
    prep.add_argument("dir", help="shard folder (indexed as a CrudeWebdataset) or a .jsonl file")
    prep.add_argument("--split", type=_split, default=(1.0, 0.0, 0.0),
                      help="train,val,test ratio of *shards* (missing parts are 0); the default puts everything in "
                           "train, so get_val_dataset yields nothing: e.g. 0.9,0.1 for a val split (needs several shards)")

    bench = add("bench", "sweep packing_buffer_size K for carry and rounds on a prepared Energon dataset")
    bench.add_argument("--data", default=DEMO_DIR,
                       help="prepared Energon dataset (energon-pack convert / prepare / make-demo); never written to")
    bench.add_argument("--buffers", type=_ints, default=(1, 4, 8, 16, 32, 64, 128, 256),
                       help="comma-separated packing_buffer_size values K")
    bench.add_argument("--modes", type=_modes, default=("carry", "rounds"), help="packing modes: carry (ours), rounds (Energon's)")
    bench.add_argument("--workers", type=_non_negative_int, default=2, help="loader worker processes (0: in this process)")
    bench.add_argument("--packs", type=_non_negative_int, default=200, help="packs per cell (0 = one full epoch)")
    bench.add_argument("--width", type=_positive_int, default=8192, help="pack width in tokens (seq_length)")
    bench.add_argument("--preset", choices=PRESET_NAMES, default="qwen2.5-vl", help="Qwen-VL vision preset")
    bench.add_argument("--tokenizer", default=None,
                       help="qwen2-vl | qwen2.5-vl | qwen3-vl (the real tokenizers, built offline), a tokenizer.json, "
                            "a local Hugging Face tokenizer folder (never downloaded), or demo (773 tokens, tests only); "
                            "default: the --preset's real tokenizer")
    bench.add_argument("--out-dir", default="bench_results", help="folder for buffer_sizes.json/.md and buffer_*.png")
    bench.add_argument("--visual-budget", action="store_true",
                       help="instead of the K sweep: recommend max_patches_per_pack for static_visual packs (fill within "
                            "0.5 points of packs without a patch budget), at --width and the largest --buffers K")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    object_read_options(bench)
    bench.add_argument("--check", action="store_true",
                       help="exit 1 when one of the project's own benchmark targets is missed (they are printed as "
                            "information otherwise)")

    bp = add("bench-packing", "fill and us/sample of OnlinePacker vs round FFD on synthetic mixes")
    bp.add_argument("--samples", type=_positive_int, default=20000, help="samples per synthetic stream")
    bp.add_argument("--buffers", type=_ints, default=None, help="comma-separated buffer sizes K (default: 1,2,4,...,256)")
    bp.add_argument("--widths", type=_ints, default=None, help="comma-separated pack widths (default: 4096,8192)")
    bp.add_argument("--seed", type=int, default=0, help="random seed of the synthetic mixes")
    bp.add_argument("--out", default="bench_results/packing.json", help="JSON report path")
    bp.add_argument("--check", action="store_true", help="exit 1 when a benchmark target is missed")

    def jsonl_options(p: argparse.ArgumentParser) -> None:
        """How a GPT-SFT JSONL file is read: format, tokenizer, width, length limit, field names."""
        from energon_pack.sft.formats import FORMATS

        p.add_argument("--format", default="prompt_completion", choices=FORMATS, help="record format")
        p.add_argument("--tokenizer", default=None,
                       help="qwen2-vl | qwen2.5-vl | qwen3-vl (the real tokenizers, built offline), a tokenizer.json, "
                            "a local Hugging Face tokenizer folder (never downloaded), or demo (773 tokens, tests only); "
                            "default: qwen2.5-vl")
        p.add_argument("--width", type=_positive_int, default=4096, help="pack width in tokens")
        p.add_argument("--max-length", type=_positive_int, default=None, help="skip samples longer than this (default: no limit)")
        p.add_argument("--prompt-field", default=None, help="prompt field name (default: the format's own, e.g. prompt/input)")
        p.add_argument("--completion-field", default=None,
                       help="completion field name (default: the format's own, e.g. completion/output)")

    ins = add("inspect", "counts, length percentiles, skips by reason and packing fill of a JSONL file")
    ins.add_argument("path", help="a prompt/completion or chat JSONL file")
    jsonl_options(ins)
    ins.add_argument("--pad-multiple", type=_positive_int, default=1, help="align every sample to this multiple")
    ins.add_argument("--json-out", default=None, help="also write the report as JSON to this path (default: not written)")

    st = add("stress", "reliability report: resume sweep, coverage, fuzz, memory (exit 1 on a missed target)")
    st.add_argument("--full", action="store_true", help="full scale (>= 200 resume cut points, every layout)")
    st.add_argument("--out", default="bench_results/stress", help="report folder")

    bp = add("bench-pixels", "worker pixel path: images per CPU-second vs HF's processor and the decode floor, "
             "per pixel_dtype; real-loader CPU and bytes per pack")
    bp.add_argument("--images", type=_positive_int, default=46, help="generated photos and scans to time")
    bp.add_argument("--rounds", type=_positive_int, default=5, help="interleaved rounds (best round counts)")
    bp.add_argument("--loader-packs", type=int, default=24, help="packs per dtype through the real loader (0: skip)")
    bp.add_argument("--no-draft", action="store_true", help="skip the jpeg_draft comparison on large photos")
    bp.add_argument("--out", default="bench_results/pixel.json", help="JSON report path")
    bp.add_argument("--check", action="store_true", help="exit 1 when a benchmark target is missed")

    bs = add("bench-sft", "GPT-SFT JSONL path: index build vs wc -l, length pass, lazy getitem samples/s, in-batch fill "
             "(on --data FILE.jsonl, else on generated prompt/completion files)")
    bs.add_argument("--data", default=None, help="your JSONL file (only read); default: generated prompt/completion files")
    jsonl_options(bs)
    bs.add_argument("--samples", type=_positive_int, default=5000, help="lines read in random order for the getitem rate")
    bs.add_argument("--size-mb", type=_positive_int, default=1024,
                    help="size of the generated JSONL for the index benchmark (without --data)")
    bs.add_argument("--out", default="bench_results/sft.json", help="JSON report path")
    bs.add_argument("--check", action="store_true",
                    help="print the project's targets for the generated-data run and exit 1 when one is missed")
    po = add("pack-offline", "GPT-SFT JSONL -> Megatron-Bridge's offline packs (OUT/training_N.idx.parquet + "
             "OUT/N_metadata.jsonl), streamed in bounded memory, best-fit packed, deterministic")
    po.add_argument("path", help="a prompt/completion or chat JSONL file (only read)")
    po.add_argument("out", help="output folder (Bridge's packed_train_data_path / packed_metadata_path go there)")
    po.add_argument("--format", default="prompt_completion", choices=["prompt_completion", "chat"], help="record format")
    po.add_argument("--tokenizer", default=None, help="qwen2-vl | qwen2.5-vl | qwen3-vl, a tokenizer.json or a local "
                    "Hugging Face folder (never downloaded), or demo; default: qwen2.5-vl")
    po.add_argument("--seq-length", "--width", dest="seq_length", type=_positive_int, default=4096,
                    help="packed_sequence_size = model.seq_length = dataset.seq_length")
    po.add_argument("--pad-seq-to-mult", type=_positive_int, default=None,
                    help="per-sample alignment (default: the rule from --cp/--tp/--sp; an explicit value must be a multiple of it)")
    po.add_argument("--cp", type=_positive_int, default=1, help="context parallel size the packs are for")
    po.add_argument("--tp", type=_positive_int, default=1, help="tensor parallel size the packs are for")
    po.add_argument("--sp", action="store_true", help="sequence parallelism on")
    po.add_argument("--seed", type=int, default=0, help="pack order seed (the same seed writes the same bytes)")
    po.add_argument("--workers", type=_positive_int, default=None, help="tokenizer processes (default: the usable cores)")
    po.add_argument("--split", default="training", choices=["training", "validation", "test"], help="file name prefix")
    po.add_argument("--eos-id", type=int, default=None,
                    help="the id Bridge's tokenizer reports as eos_id (alignment padding; default: the tokenizer's EOS)")
    po.add_argument("--prompt-field", default=None, help="prompt field name (default: prompt)")
    po.add_argument("--completion-field", default=None, help="completion field name (default: completion)")
    po.add_argument("--json-out", default=None, help="also write the summary as JSON to this path")

    bo = add("bench-offline", "offline packing side by side with Bridge's tokenize_dataset + create_packing_strategy "
             "(first_fit_shuffle / first_fit_decreasing): fill, packs, peak RSS, wall time")
    from energon_pack.bench.offline_pack_bench import add_arguments as bench_offline_arguments

    bench_offline_arguments(bo)
    return parser


# ------------------------------------------------------------------------------------ commands
def run_demo(args: argparse.Namespace) -> int:
    from energon_pack.bench.loader_bench import cells_to_json, format_cells, run_cell

    data = demo_dataset(args.data, args.samples)
    tokenizer, described = load_tokenizer(None, default="qwen2.5-vl")
    print(f"tokenizer: {described}; preset qwen2.5-vl", flush=True)
    cells = [
        run_cell(data, mode=mode, buffer=args.buffer, workers=args.workers, packs=args.packs,
                 seq_length=args.width, progress=True, tokenizer=tokenizer)
        for mode in ("carry", "rounds")
    ]
    print(f"\nQwen2.5-VL packing on {data} (width {args.width}, packing_buffer_size {args.buffer}, "
          f"{args.workers} workers, {args.packs} packs per mode)\n")
    print(format_cells(cells))
    carry, rounds = cells
    print(
        f"\ncarry (ours): {carry.fill * 100:.2f}% fill, {carry.samples_per_pack:.1f} samples/pack, "
        f"{carry.slots - carry.real_tokens} pad tokens in {carry.packs} packs\n"
        f"rounds (Energon's PackingDataset + FFD): {rounds.fill * 100:.2f}% fill, "
        f"{rounds.samples_per_pack:.1f} samples/pack, {rounds.slots - rounds.real_tokens} pad tokens in {rounds.packs} packs"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": str(data), "cells": cells_to_json(cells)}, indent=2))
    print(f"wrote {out}")
    return 0


def run_make_demo(args: argparse.Namespace) -> int:
    from energon_pack.energon.demo_data import make_demo_shards

    refuse_remote_output(args.dir, "demo data")
    root = Path(args.dir)
    if root.is_file():
        raise CliError(f"{root} is a file: pass a new or empty folder")
    if root.is_dir():
        foreign = [p.name for p in root.iterdir()
                   if not (p.name == ".nv-meta" or (p.name.startswith("demo-") and p.name.endswith((".tar", ".tar.idx"))))]
        if foreign:
            raise CliError(f"{root} is not empty (it holds {', '.join(sorted(foreign)[:3])}"
                           f"{', ...' if len(foreign) > 3 else ''}): demo data goes into a new or empty folder")
    make_demo_shards(root, args.samples, seed=args.seed)
    print(f"wrote {args.samples} samples to {root}")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    from energon_pack.energon.prepare import prepare
    from energon_pack.storage import is_remote

    if is_remote(args.dir):
        return _prepare_remote(args.dir, args.split)
    path = Path(args.dir)
    kind = dataset_kind(path)
    if kind == "missing":
        raise CliError(f"{path} does not exist: pass a folder of *.tar shards or a .jsonl file")
    if path.is_file() and path.suffix != ".jsonl":
        raise CliError(f"{path} is not a .jsonl file or a shard folder: convert JSON/JSONL/Parquet VLM data with "
                       f"`energon-pack convert {path} OUT` (it prepares OUT)")
    if path.is_dir() and kind not in ("shards", "prepared"):
        src = raw_sources(path)
        hint = (f"convert it with `energon-pack convert {src[0] if len(src) == 1 else path} OUT`" if src
                else "write shards with `energon-pack convert SOURCE OUT` or `energon-pack make-demo DIR`")
        raise CliError(f"{path} holds no *.tar shards: {hint}")
    count = prepare(path, **({} if path.is_file() else {"split": tuple(args.split)}))
    print(f"prepared {path}: {count} samples")
    if path.is_dir():
        _report_splits(path, args.split)
    return 0


def _prepare_remote(url: str, split: tuple[float, float, float]) -> int:
    """``energon-pack prepare msc://...``: a prefix of *.tar shards is indexed in place (Energon reads
    each shard once); anything else is refused before a byte is written."""
    from energon_pack.energon.prepare import prepare_webdataset

    kind = dataset_kind(url)
    if kind not in ("shards", "prepared"):
        fix = ("JSONL files are indexed on local disk only: copy it here and prepare it there"
               if url.endswith(".jsonl") else "pass the prefix of your *.tar shards")
        raise CliError(f"{url} {REMOTE_KIND[kind]}: {fix}")
    count = prepare_webdataset(url, split=tuple(split))
    print(f"prepared {url}: {count} samples")
    _report_splits(url, split)
    return 0


def _report_splits(path: str | Path, split: tuple[float, float, float]) -> None:
    """Shards per split of a prepared folder or prefix, with a warning for a requested split left empty."""
    import yaml
    from braceexpand import braceexpand

    from energon_pack.storage import epath

    parts = yaml.safe_load((epath(path) / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    # Energon collapses runs of shard names into brace patterns (demo-{000000..000002}.tar)
    shards = {name: sum(1 for p in parts.get(name) or [] for _ in braceexpand(p)) for name in ("train", "val", "test")}
    print("shards per split: " + ", ".join(f"{k} {v}" for k, v in shards.items()))
    for name, ratio in zip(shards, split):
        if ratio > 0 and shards[name] == 0:
            print(f"warning: the {name} split got no shard (ratios apply to whole shards, {sum(shards.values())} "
                  f"here): write more, smaller shards (e.g. `energon-pack convert --samples-per-shard`) or "
                  f"change --split", file=sys.stderr)
    if shards["val"] == 0:
        print("no val split: get_val_dataset yields nothing; `energon-pack prepare DIR --split 0.9,0.1` makes one "
              "(needs several shards)")


def run_bench(args: argparse.Namespace) -> int:
    from energon_pack.bench import buffer_sweep
    from energon_pack.bench.targets import format_target

    tokenizer, described = load_tokenizer(args.tokenizer, default=args.preset)  # a bad knob is named before the data is looked at
    data = require_prepared(args.data)
    print(f"data: {data}; preset: {args.preset}; tokenizer: {described}", flush=True)
    if args.visual_budget:
        from energon_pack.bench import visual_budget

        visual_budget.main(str(data), args.out_dir, width=args.width, buffer=max(args.buffers), preset=args.preset,
                           tokenizer=tokenizer)
        return 0
    result = buffer_sweep.main(
        data, args.out_dir, plots=not args.no_plots, buffers=args.buffers, modes=args.modes, workers=args.workers,
        packs=args.packs or None, seq_length=args.width, preset=args.preset, tokenizer=tokenizer,
        tokenizer_name=described,
    )
    return _targets_exit(result["targets"], args.check, format_target)


def _targets_exit(targets: list[dict], check: bool, formatter: Any = None) -> int:
    missed = [t for t in targets if not t["met"]]
    if not check:
        if targets:
            print("(the targets above are the project's own benchmark goals on its demo data, shown for "
                  "information; --check makes a missed target exit 1)")
        return 0
    if missed:
        print(f"--check: {len(missed)} of {len(targets)} targets missed", file=sys.stderr)
        return 1
    return 0


def _field_kw(args: argparse.Namespace) -> dict[str, Any]:
    """``--prompt-field`` / ``--completion-field`` as dataset keywords (only those given)."""
    fields = {"prompt_field": args.prompt_field, "completion_field": args.completion_field}
    return {k: v for k, v in fields.items() if v}


def _jsonl_file(spec: str) -> Path:
    """``spec`` as a local JSONL file; a :class:`CliError` otherwise (object storage included: the GPT-SFT
    reader seeks by a line index of a local file)."""
    from energon_pack.storage import is_remote

    if is_remote(spec):
        raise CliError(f"{spec}: JSONL files are read from local disk only (the line index seeks in the file): copy "
                       f"it here first")
    path = Path(spec)
    if not path.is_file():
        raise CliError(f"{path} is not a file: pass a JSONL file" + (" (a folder was given)" if path.is_dir() else ""))
    return path


def run_bench_sft(args: argparse.Namespace) -> int:
    from energon_pack.bench import sft_bench

    if args.data is None:
        if args.tokenizer is not None or args.format != "prompt_completion" or _field_kw(args):
            raise CliError("--tokenizer, --format and the field names apply to --data FILE.jsonl (the generated "
                           "prompt/completion files use the real Qwen2.5-VL tokenizer)")
        result = sft_bench.main(args.out, size_mb=args.size_mb, getitem_samples=args.samples, check=args.check)
        return _targets_exit(result["targets"], args.check) if args.check else 0
    path = _jsonl_file(args.data)
    tokenizer, described = load_tokenizer(args.tokenizer)
    sft_bench.main(args.out, data=path, tokenizer=tokenizer, tokenizer_name=described, format=args.format,
                   width=args.width, getitem_samples=args.samples, max_length=args.max_length, **_field_kw(args))
    if args.check:
        print("--check: the project's targets are set on generated data; there are none to grade on --data")
    return 0


def run_bench_pixels(args: argparse.Namespace) -> int:
    import importlib.util

    from energon_pack.bench import pixel_bench

    hf = importlib.util.find_spec("transformers") is not None
    if not hf:
        print("transformers is not installed: the HF processor column is left out (pip install transformers)")
    result = pixel_bench.main(args.out, images=args.images, rounds=args.rounds, loader_packs=max(args.loader_packs, 0),
                              draft=not args.no_draft, hf=hf)
    return _targets_exit(result["targets"], args.check)


def run_inspect(args: argparse.Namespace) -> int:
    from energon_pack.sft.inspect import main as inspect_main

    path = _jsonl_file(args.path)
    tokenizer, described = load_tokenizer(args.tokenizer)
    print(f"tokenizer: {described}", flush=True)
    return inspect_main(path, format=args.format, tokenizer=tokenizer, cli=True,
                        width=args.width, pad_multiple=args.pad_multiple, max_length=args.max_length,
                        json_out=args.json_out, **_field_kw(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return run_demo(args)
    if args.command == "make-demo":
        return run_make_demo(args)
    if args.command == "prepare":
        return run_prepare(args)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "bench-packing":
        from energon_pack.bench import packing_bench

        kw = {"samples": args.samples, "seed": args.seed}
        if args.buffers:
            kw["buffers"] = args.buffers
        if args.widths:
            kw["widths"] = args.widths
        return _targets_exit(packing_bench.main(args.out, **kw)["targets"], args.check)
    if args.command == "inspect":
        return run_inspect(args)
    if args.command == "stress":
        from energon_pack.bench.stress_report import main as stress_main

        return stress_main((["--full"] if args.full else []) + ["--out", args.out])
    if args.command == "bench-sft":
        return run_bench_sft(args)
    if args.command == "bench-pixels":
        return run_bench_pixels(args)
    if args.command == "pack-offline":
        from energon_pack.integrations.bridge_sft import check_gpt_sft_config
        from energon_pack.sft.pack_offline import run_cli

        return run_cli(args, load_tokenizer(args.tokenizer), _jsonl_file(args.path), _field_kw(args), check_gpt_sft_config)
    if args.command == "bench-offline":
        from energon_pack.bench.offline_pack_bench import run_cli as bench_offline

        return bench_offline(args)
    raise CliError(f"unknown command {args.command!r}")


#: library wording that names a Python knob -> the CLI flag that sets it (``bench`` / ``demo`` / ``inspect``)
CLI_TERMS = (
    ("seq_length (the pack width) may be too small for these samples, or set overlength='truncate' (text)",
     "--width may be too small for these samples"),
    ("the width ({w}) or the dataset's max_length may be too small for these lines, or set overlength='truncate' "
     "on the dataset", "--width ({w}) or --max-length may be too small for these lines"),
    ("Check the field names, seq_length and", "Check the field names, --width and"),
    ("at or above skip_warn_rate", "at or above"),
    (" (logged once per worker; PackingConfig.skip_warn_rate=None turns this off)", " (once per worker)"),
)


#: a knob named in a ConfigError -> its flag (``width`` only where it is named as a knob: ``width:``, ``width=``)
CLI_FLAGS = {"seq_length": "--width", "pad_multiple": "--pad-multiple", "max_length": "--max-length",
             "prompt_field": "--prompt-field", "completion_field": "--completion-field", "width": "--width"}
#: ``packing_buffer_size`` per command
BUFFER_FLAGS = {"bench": "--buffers", "demo": "--buffer"}


def cli_terms(text: str, command: str | None = None) -> str:
    """``text`` with the Python knobs of :data:`CLI_TERMS` and :data:`CLI_FLAGS` (and
    ``packing_buffer_size`` for ``command``) replaced by the CLI's flags."""
    import re

    for python, flag in CLI_TERMS:
        pattern = re.escape(python).replace(re.escape("{w}"), r"(\d+)")
        text = re.sub(pattern, lambda m: flag.replace("{w}", m.group(1)) if m.groups() else flag, text)
    flags = {**CLI_FLAGS, **({"packing_buffer_size": BUFFER_FLAGS[command]} if command in BUFFER_FLAGS else {})}
    for knob, flag in flags.items():
        after = r"(?=\s*(?::|=|>=))" if knob == "width" else r"(?![\w-])"
        text = re.sub(rf"(?<![\w-]){knob}{after}", flag, text)
    return text


def _original_message(exc: BaseException) -> str:
    """The message of ``exc``; for an error re-raised from a DataLoader worker (torch wraps it as
    "Caught X in DataLoader worker process N. Original Traceback ..."), the worker's own message."""
    text = str(exc)
    if "Original Traceback (most recent call last):" not in text:
        return text
    name = type(exc).__name__
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        head, sep, rest = lines[i].partition(": ")
        if sep and (head == name or head.endswith("." + name)):
            return "\n".join([rest, *lines[i + 1:]])
    return lines[-1]


def _one_line(exc: BaseException, command: str | None = None) -> str:
    """A user-facing line for ``exc``, with the next step where we know it (flags of ``command``)."""
    text = cli_terms(" ".join(_original_message(exc).split()), command) or type(exc).__name__
    if text.startswith("Invalid dataset at"):
        return (f"{text}: not a prepared Energon dataset: run `energon-pack prepare DIR` for *.tar shards or "
                f"`energon-pack convert SOURCE OUT` for JSON/JSONL/Parquet data")
    if text.startswith("No shards found in split part"):
        return (f"{text}: the dataset's split gives this part no shard: re-run `energon-pack prepare DIR --split "
                f"TRAIN,VAL,TEST` (ratios of whole shards)")
    from energon_pack.errors import AllSkippedError, ConfigError

    if isinstance(exc, (CliError, ConfigError, AllSkippedError)):
        return text
    return f"{type(exc).__name__}: {text} (run again with --debug for the traceback)"


#: seconds a Ctrl-C leaves for ``finally`` blocks before the process exits regardless (a
#: KeyboardInterrupt raised inside a finaliser or a library's cleanup is swallowed by Python)
INTERRUPT_GRACE_S = 2.0


class _Interrupt:
    """The CLI's SIGINT handler: the first Ctrl-C raises KeyboardInterrupt (or exits at once inside
    a ``__del__``, where Python would swallow it) and the process exits with 130 within
    :data:`INTERRUPT_GRACE_S` however it is handled (worker processes are ended; a swallowed
    KeyboardInterrupt prints no "Exception ignored" noise); a second Ctrl-C exits at once."""

    def __init__(self, prog: str) -> None:
        self.prog, self.hit, self.reported, self.pid = prog, False, False, os.getpid()

    def __call__(self, signum: int, frame: Any) -> None:
        import signal
        import threading

        if os.getpid() != self.pid:  # a forked worker inherited the handler: the plain KeyboardInterrupt
            signal.default_int_handler(signum, frame)
        if self.hit or _in_finaliser(frame):  # Python would swallow a KeyboardInterrupt raised in a __del__
            self.exit()
        self.hit = True
        hook = sys.unraisablehook
        sys.unraisablehook = lambda u: None if isinstance(u.exc_value, KeyboardInterrupt) else hook(u)
        timer = threading.Timer(INTERRUPT_GRACE_S, self.exit)
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    def report(self) -> None:
        """The one line an interrupted command prints, once (progress bars cleared first)."""
        if self.reported:
            return
        self.reported = True
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
        print(f"{self.prog}: interrupted", file=sys.stderr, flush=True)

    def exit(self) -> NoReturn:
        import psutil

        self.report()
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        sys.stdout.flush()
        os._exit(130)


def _in_finaliser(frame: Any) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (e.g. a DataLoader joining its workers in a gc pass)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _interruptible(prog: str, run: Any) -> int:
    """``run()`` with :class:`_Interrupt` as the SIGINT handler (in the main thread): 130 on Ctrl-C."""
    import signal
    import threading

    handler = _Interrupt(prog)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, handler) if main_thread else None
    try:
        return run()
    except KeyboardInterrupt:
        if handler.hit:  # a real Ctrl-C: the finally blocks have run; loader workers are not waited for
            handler.exit()
        handler.report()
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:
        from energon_pack.energon.convert import main as convert_main

        return _interruptible("energon-pack convert", lambda: convert_main(argv[1:]))
    args = build_parser().parse_args(argv)
    prog = f"energon-pack {args.command}"
    with contextlib.ExitStack() as scope, _one_line_warnings(prog):
        if getattr(args, "cache_dir", None):  # through the environment, so worker processes follow it
            from energon_pack.env import CACHE_DIR_VARIABLE, environ_set

            scope.enter_context(environ_set(CACHE_DIR_VARIABLE, str(Path(args.cache_dir).expanduser().resolve())))
        return _interruptible(prog, lambda: _run(args, prog))


@contextlib.contextmanager
def _one_line_warnings(prog: str) -> Iterator[None]:
    """Library warnings as one line each (``PROG: warning: ...``, CLI flags for Python knobs); the
    package logger's copy of the same message is not printed a second time."""
    import logging
    import warnings

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"{prog}: warning: {cli_terms(' '.join(str(message).split()), prog.split()[-1])}", file=sys.stderr,
              flush=True)

    logger, quiet, saved = logging.getLogger("energon_pack"), logging.NullHandler(), warnings.showwarning
    logger.addHandler(quiet)
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved
        logger.removeHandler(quiet)


def _run(args: argparse.Namespace, prog: str) -> int:
    """The command, with a user error as one line on stderr and exit status 2 (1 for a bug)."""
    try:
        for name in OUTPUT_ARGS:  # before anything is read or written
            refuse_remote_output(getattr(args, name, None), f"--{name.replace('_', '-')}")
        with object_reads(args):
            return _dispatch(args)
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        print(f"{prog}: error: {_one_line(exc, args.command)}", file=sys.stderr)
        from energon_pack.errors import AllSkippedError, ConfigError

        user_error = isinstance(exc, (CliError, ConfigError, AllSkippedError, FileNotFoundError, ValueError, OSError))
        return 2 if user_error or type(exc).__name__ == "EmptyDatasetError" else 1


if __name__ == "__main__":
    sys.exit(main())
