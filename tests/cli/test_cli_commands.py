"""Issue 31: the CLI as a package (one module per command), library errors reaching it as data and
worded there; the runtime wing's own rules are checked in tests/project/test_house.py."""

import argparse
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from energon_pack.cli import build_parser, main
from energon_pack.cli.main import COMMANDS
from energon_pack.cli.wording import one_line
from energon_pack.errors import AllSkippedError, Hint, SkipRateWarning, knob_names, render_hints

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "energon_pack"

TOO_LONG = (
    Hint("{seq_length} may be too small", ("seq_length",), python=(("seq_length", "seq_length (the pack width)"),)),
    Hint("set {overlength}='truncate'", ("overlength",), sep=", or "),
)


# ----------------------------------------------------------------------------- hints: Python names vs flags
def test_a_hint_renders_python_names_flags_or_nothing_when_its_knob_has_no_flag():
    width, overlength = TOO_LONG
    assert width.render() == "seq_length (the pack width) may be too small"
    assert width.render({"seq_length": "--width"}) == "--width may be too small"
    assert overlength.render() == "set overlength='truncate'"
    assert overlength.render({"seq_length": "--width"}) is None  # no flag for it: dropped
    assert render_hints(TOO_LONG) == "seq_length (the pack width) may be too small, or set overlength='truncate'"
    assert render_hints(TOO_LONG, {"seq_length": "--width"}) == "--width may be too small"
    assert Hint.plain("use {braces} as they are").render({}) == "use {braces} as they are"
    with pytest.raises(ValueError, match="placeholders"):
        Hint("{seq_length} and {width}", ("seq_length",))


def test_all_skipped_error_carries_its_data_and_words_it_for_python_or_a_command():
    err = AllSkippedError(
        "rank 0 worker 0 skipped the first 40 samples it read and emitted 0 packs",
        who="rank 0 worker 0",
        skips={"oversize": 40},
        hints=TOO_LONG,
    )
    assert (err.who, err.skips, err.hints) == ("rank 0 worker 0", {"oversize": 40}, TOO_LONG)
    python = (
        "rank 0 worker 0 skipped the first 40 samples it read and emitted 0 packs; skips by reason: "
        "oversize: 40. Likely fix: seq_length (the pack width) may be too small, or set overlength='truncate'."
    )
    assert str(err) == python
    assert err.render({"seq_length": "--width"}).endswith("Likely fix: --width may be too small.")
    assert err.render({}).endswith("skips by reason: oversize: 40.")  # every hint dropped: no "Likely fix"
    with knob_names({"seq_length": "--width"}):  # what the CLI sets, so forked workers word it too
        assert str(err).endswith("Likely fix: --width may be too small.")
    assert str(err) == python
    again = pickle.loads(pickle.dumps(err))  # across process pools: data intact
    assert (str(again), again.skips, again.hints) == (python, err.skips, err.hints)
    assert str(AllSkippedError("Caught AllSkippedError in DataLoader worker 0")) == (
        "Caught AllSkippedError in DataLoader worker 0"
    )  # how torch re-raises a worker's error: one message


def test_skip_rate_warning_is_a_runtime_warning_worded_per_command():
    warning = SkipRateWarning(
        "rank 0 worker 1",
        skipped=16,
        window=20,
        rate=0.5,
        skips={"missing_field": 16},
        examples={"missing_field": "k: no field"},
        hints=(Hint("Check {seq_length}", ("seq_length",)),),
    )
    assert isinstance(warning, RuntimeWarning) and warning.skips == {"missing_field": 16}
    assert str(warning) == (
        "rank 0 worker 1: 16 of the last 20 samples were skipped (80%, at or above skip_warn_rate "
        "50%); skips by reason so far: missing_field: 16; one example per reason: "
        "missing_field: k: no field. Check seq_length (logged once per worker; "
        "PackingConfig.skip_warn_rate=None turns this off)"
    )
    assert warning.render({"seq_length": "--width"}) == (
        "rank 0 worker 1: 16 of the last 20 samples were skipped (80%, at or above 50%); skips by reason so far: "
        "missing_field: 16; one example per reason: missing_field: k: no field. Check --width (once per worker)"
    )
    assert "Check" not in warning.render({})


def test_the_cli_words_library_errors_with_each_commands_flags():
    from energon_pack.cli import bench, demo, pack_offline
    from energon_pack.errors import ConfigError

    err = AllSkippedError("w skipped everything", skips={"oversize": 3}, hints=TOO_LONG)
    assert one_line(err, bench.KNOB_FLAGS).endswith("Likely fix: --seq-length may be too small.")
    assert one_line(err) == str(err)  # no flags: the library's own wording
    config = ConfigError("packing_buffer_size", "must be >= 1", "use packing_buffer_size=64")
    assert one_line(config, demo.KNOB_FLAGS) == "--buffer: must be >= 1. Fix: use --buffer=64"
    assert one_line(config, bench.KNOB_FLAGS) == "--buffers: must be >= 1. Fix: use --buffers=64"
    assert one_line(config, pack_offline.KNOB_FLAGS) == str(config)  # no such flag there: the Python name


# ----------------------------------------------------------------------------- one module per command
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_module_is_registered_with_add_parser_and_run():
    names = [module.NAME for module in COMMANDS]
    assert len(names) == len(set(names)) == 13
    for module in COMMANDS:
        assert callable(module.add_parser) and callable(module.run) and isinstance(module.KNOB_FLAGS, dict), module
    assert set(_subparsers(build_parser())) == set(names) | {"convert"}
    assert "stress" not in _subparsers(build_parser())  # python tests/stress/report.py


@pytest.mark.parametrize("command", [module.NAME for module in COMMANDS] + ["convert"])
def test_every_commands_help_works(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0 and f"energon-pack {command}" in capsys.readouterr().out


def test_help_imports_no_heavy_library_and_python_m_runs_the_same_cli():
    code = (
        "import sys; from energon_pack.cli import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('torch', 'megatron.energon', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert proc.stdout.strip() == "[]"
    proc = subprocess.run(
        [sys.executable, "-m", "energon_pack.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "pack-offline" in proc.stdout


def test_jsonl_format_choices_are_the_sft_formats():
    from energon_pack.cli.options import JSONL_FORMATS
    from energon_pack.sft.formats import FORMATS

    assert JSONL_FORMATS == tuple(FORMATS)
