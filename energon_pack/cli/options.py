"""The argparse pieces every command shares: number types, the help formatter, the one-line error
parser, the options common to all commands, object-storage read options and the JSONL options."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from energon_pack.chat.conversation import PREFERENCE_MODES
from energon_pack.object_waits import DEFAULT_READ_TIMEOUT, DEFAULT_WAIT_BUDGET
from energon_pack.packing.balanced import BALANCE_MODES
from energon_pack.packing.spec import DEFAULTS, knob_help


def int_at_least(minimum: int):
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


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    """An argparse type: a number > 0 (seconds), with a one-line message otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0")
    return value


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated positive whole numbers (``8,32,64``)."""
    values = tuple(positive_int(x.strip()) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one number, e.g. 8,32,64")
    return values


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
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


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block) and exit status 2, and no abbreviated options
    (``--dat`` is not ``--data``: a flag means what it says, and a new option never changes what an old
    command line does). Every command's subparser is built from this class, so they all inherit both."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kw: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kw)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def common_options() -> argparse.ArgumentParser:
    """The options of every command (``--debug``, ``--cache-dir``), as an argparse parent."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of an error (default: off: a one-line message, exit status 2)",
    )
    common.add_argument(
        "--cache-dir",
        default=None,
        help="folder for caches (JSONL line index and lengths, the built Qwen tokenizer); "
        "default: $ENERGON_PACK_CACHE_DIR, else $XDG_CACHE_HOME/energon_pack, else "
        "~/.cache/energon_pack (never next to your data)",
    )
    return common


def add_command(subparsers: Any, name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
    """A command's parser: its help as description, the common options, defaults in every help line."""
    return subparsers.add_parser(
        name, help=help, description=help, parents=[common_options()], formatter_class=HelpFormatter, **kw
    )


def object_read_options(p: argparse.ArgumentParser) -> None:
    """How shards in object storage are read (``energon_pack.object_reads``; msc:// datasets only)."""
    p.add_argument(
        "--whole-object-limit",
        type=non_negative_int,
        default=None,
        help="msc:// shards up to this many bytes are downloaded whole, larger ones range-read "
        "(default: multi-storage-client's 512 MiB)",
    )
    p.add_argument(
        "--read-ahead",
        type=non_negative_int,
        default=0,
        help="bytes each range read of an msc:// shard asks for at least (e.g. 1048576: a sample and its "
        "neighbours in one request; 0: one request per read, multi-storage-client's own)",
    )
    object_wait_options(p)


#: how the object-wait knobs read on the command line (each command's KNOB_FLAGS holds them)
OBJECT_WAIT_FLAGS = {"wait_budget": "--object-wait-budget"}


def object_wait_options(p: argparse.ArgumentParser) -> None:
    """How long a read from object storage may wait (``energon_pack.object_waits``; msc:// paths only)."""
    p.add_argument(
        "--object-timeout",
        type=positive_float,
        default=DEFAULT_READ_TIMEOUT,
        help="seconds to connect to the store and to wait for each read of its answer, for MSC profiles that "
        "set no connect_timeout / read_timeout",
    )
    p.add_argument(
        "--object-wait-budget",
        type=positive_float,
        default=DEFAULT_WAIT_BUDGET,
        help="seconds one msc:// object may take across retries before the run fails naming it",
    )


@contextlib.contextmanager
def object_reads(args: argparse.Namespace) -> Iterator[None]:
    """While the command runs: bounded waits on object storage when it names an ``msc://`` path
    (``--object-timeout`` / ``--object-wait-budget``), and ``--whole-object-limit`` / ``--read-ahead``;
    MSC's own behaviour again after."""
    with contextlib.ExitStack() as scope:
        if _names_object_storage(args):
            from energon_pack.object_waits import configure_object_waits

            timeout = getattr(args, "object_timeout", DEFAULT_READ_TIMEOUT)
            configure_object_waits(
                connect_timeout=timeout,
                read_timeout=timeout,
                wait_budget=getattr(args, "object_wait_budget", DEFAULT_WAIT_BUDGET),
            )
            scope.callback(configure_object_waits, wait_budget=None)
        if getattr(args, "whole_object_limit", None) is not None or getattr(args, "read_ahead", 0):
            from energon_pack.object_reads import configure_object_reads

            configure_object_reads(whole_object_limit=args.whole_object_limit, read_ahead=args.read_ahead)
            scope.callback(configure_object_reads)
        yield


def _names_object_storage(args: argparse.Namespace) -> bool:
    """Whether any argument of the command is an ``msc://`` (or other ``scheme://``) path."""
    from energon_pack.storage import is_remote

    values = [v for value in vars(args).values() for v in (value if isinstance(value, list) else [value])]
    return any(isinstance(v, str) and is_remote(v) for v in values)


#: the ``--tokenizer`` help of the commands that read JSONL
TOKENIZER_HELP = (
    "qwen2-vl | qwen2.5-vl | qwen3-vl (the real tokenizers, built offline), a tokenizer.json, "
    "a local Hugging Face tokenizer folder (never downloaded), or demo (773 tokens, tests only); "
)


#: the record formats of ``energon_pack.sft.formats.FORMATS``, named here so that building the parser
#: (``--help``) does not import the GPT-SFT package and torch (a test keeps the two equal)
JSONL_FORMATS = ("prompt_completion", "chat", "text")


FORMAT_HELP = (
    "record format: prompt_completion ({prompt, completion}, NeMo's {input, output} or alpaca's {instruction, "
    "input, output}), chat (messages / conversations), text ({text} documents, all supervised, EOS-separated)"
)
PREFERENCE_HELP = (
    "--format chat: preference records (DPO/ORPO/reward chosen/rejected pairs, LLaMA-Factory ranking): refuse: "
    "counted preference_data skips; chosen: their prompt and chosen answer train as an SFT record"
)


def preference_option(p: argparse.ArgumentParser) -> None:
    """``--preference {refuse,chosen}``: what ``--format chat`` does with preference records."""
    p.add_argument("--preference", default="refuse", choices=PREFERENCE_MODES, help=PREFERENCE_HELP)


# ------------------------------------------------------------------------------- packing spec flags
#: how each :class:`~energon_pack.packing.spec.PackingSpec` knob is parsed; its flag is the knob with dashes
#: (``--seq-length``), its help the first sentence of the knob's one docstring, its default the spec's
SPEC_ARGS: dict[str, dict[str, Any]] = {
    "seq_length": {"type": positive_int},
    "cp": {"type": positive_int},
    "tp": {"type": positive_int},
    "sp": {"action": "store_true"},
    "eval_cp": {"type": positive_int},
    "pad_to_max_length": {"action": "store_true"},
    "pad_cu_seqlens": {"action": "store_true"},
    "max_segments": {"type": positive_int},
    "max_media_per_pack": {"type": positive_int},
    "max_patches_per_pack": {"type": positive_int},
    "balance": {"choices": BALANCE_MODES},
    "cost_model": {},
    "seed": {"type": int},
}
#: old flags of spec knobs: still parsed, each says once that it is deprecated and names the new flag
OLD_FLAGS = {"--width": "seq_length"}


def spec_flag(knob: str) -> str:
    """The flag of a spec knob: ``seq_length`` -> ``--seq-length``."""
    return "--" + knob.replace("_", "-")


def spec_flags(*knobs: str) -> dict[str, str]:
    """``{knob: flag}`` of spec knobs, with each old knob name a road took for them (for wording library
    messages: ``KNOB_FLAGS``)."""
    flags = {knob: spec_flag(knob) for knob in knobs}
    if "seq_length" in flags:
        flags["width"] = flags["seq_length"]  # messages of roads that still say the old name
    return flags


class DeprecatedFlag(argparse.Action):
    """An old flag of a spec knob (:data:`OLD_FLAGS`): sets its ``dest`` and says once, on stderr, which flag
    replaces it (``const``: the replacement's words, default the flag of ``dest``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        if not getattr(self, "said", False):
            self.said = True
            print(f"{parser.prog}: {option} is deprecated, use {self.const or spec_flag(self.dest)}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def spec_options(
    p: argparse.ArgumentParser, *knobs: str, defaults: dict[str, Any] | None = None, notes: dict[str, str] | None = None
) -> None:
    """The flags of the spec ``knobs`` (:data:`SPEC_ARGS`): ``--seq-length`` ..., each knob's old flags as
    :class:`DeprecatedFlag` aliases. ``defaults``: a command's own default for a knob (else the spec's);
    ``notes``: words added to a knob's help for this command."""
    for knob in knobs:
        kw = SPEC_ARGS[knob]
        default = (defaults or {}).get(knob, DEFAULTS[knob])
        text = knob_help(knob) + (notes or {}).get(knob, "")
        p.add_argument(spec_flag(knob), dest=knob, default=default, help=text, **kw)
        for old in (flag for flag, new in OLD_FLAGS.items() if new == knob):
            alias = {"type": kw["type"]} if "type" in kw else {}
            p.add_argument(
                old,
                dest=knob,
                action=DeprecatedFlag,
                default=argparse.SUPPRESS,
                help=f"deprecated: use {spec_flag(knob)} (whose default applies)",
                **alias,
            )


def jsonl_options(p: argparse.ArgumentParser) -> None:
    """How a GPT-SFT JSONL file is read: format, tokenizer, width, length limit, field names."""
    p.add_argument("--format", default="prompt_completion", choices=JSONL_FORMATS, help=FORMAT_HELP)
    p.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP + "default: qwen2.5-vl")
    spec_options(p, "seq_length", defaults={"seq_length": 4096})
    p.add_argument(
        "--max-length", type=positive_int, default=None, help="skip samples longer than this (default: no limit)"
    )
    p.add_argument(
        "--prompt-field",
        default=None,
        help="the field holding the prompt, --format prompt_completion only (default: prompt)",
    )
    p.add_argument(
        "--completion-field",
        default=None,
        help="the field holding the completion, --format prompt_completion only (default: completion)",
    )
    preference_option(p)


def field_kw(args: argparse.Namespace) -> dict[str, Any]:
    """The format keywords the flags give: ``--prompt-field`` / ``--completion-field`` (only those given) and
    ``--preference`` (only when not the default); a :class:`CliError` for a format that has no such knob (chat
    records are read by their ``messages`` / ``conversations``; only chat records are preference pairs)."""
    from .common import CliError

    fields = {"prompt_field": args.prompt_field, "completion_field": args.completion_field}
    given = {k: v for k, v in fields.items() if v}
    fmt = getattr(args, "format", "prompt_completion")
    if given and fmt != "prompt_completion":
        flags = " / ".join("--" + k.replace("_", "-") for k in given)
        verb = "applies" if len(given) == 1 else "apply"
        raise CliError(
            f"{flags} {verb} to --format prompt_completion only; --format {fmt} reads the messages / "
            f"conversations of each record: drop {flags}"
        )
    preference = getattr(args, "preference", "refuse")
    if preference != "refuse":
        if fmt != "chat":
            raise CliError(f"--preference applies to --format chat only (--format {fmt}): drop --preference")
        given["preference"] = preference
    return given


#: the knobs the JSONL options set (for wording library messages)
JSONL_FLAGS = {
    **spec_flags("seq_length"),
    "max_length": "--max-length",
    "prompt_field": "--prompt-field",
    "completion_field": "--completion-field",
    "preference": "--preference",
}
