"""PackingSpec, the one declaration of the path-neutral packing knobs (issue 46 item 1): every knob validated by the
spec, every old name mapped or refused naming the new one, one balance default rule on the Energon, SFT and CLI
roads, resume keys unchanged, and no road declaring a knob with its default again."""

import argparse
import ast
import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from energon_pack.energon.config import RESUME_SAFE_KNOBS, PackingConfig
from energon_pack.errors import ConfigError
from energon_pack.packing.spec import (
    DEFAULTS,
    KNOB_DOCS,
    OLD_NAMES,
    PackingSpec,
    default_balance,
    knob_help,
    spec_knobs,
)
from energon_pack.sft import InBatchPacker, TokenBudgetBatchSampler
from energon_pack.thd import ThdLayout

PACKAGE = Path(__file__).resolve().parents[2] / "energon_pack"

# ------------------------------------------------------------------------------------------------ validation
#: one wrong value per knob, and the knob the ConfigError names
BAD = {
    "seq_length": {"seq_length": 0},
    "cp": {"cp": 0},
    "tp": {"tp": 2.0},
    "sp": {"sp": "yes"},
    "eval_cp": {"eval_cp": 0},
    "pad_to_max_length": {"pad_to_max_length": 1},
    "pad_cu_seqlens": {"pad_cu_seqlens": True, "max_segments": 4},  # without a fixed width
    "max_segments": {"max_segments": 0},
    "max_media_per_pack": {"max_media_per_pack": 0},
    "max_patches_per_pack": {"max_patches_per_pack": True},
    "overlength": {"overlength": "drop"},
    "balance": {"balance": "fast"},
    "cost_model": {"cost_model": 3.5},
    "seed": {"seed": "one"},
}


def test_every_knob_is_validated_by_the_spec():
    assert set(BAD) == set(spec_knobs())
    for knob, kw in BAD.items():
        with pytest.raises(ConfigError) as err:
            PackingSpec(**kw)
        assert err.value.knob == knob, (knob, str(err.value))
        with pytest.raises(ConfigError) as again:  # the Energon config validates through the same spec
            PackingConfig(**kw)
        assert str(again.value) == str(err.value)


def test_width_not_divisible_by_the_alignment_names_where_the_alignment_comes_from():
    with pytest.raises(ConfigError) as err:
        PackingSpec(seq_length=100, cp=2, tp=4, sp=True)
    assert str(err.value) == (
        "seq_length: 100 is not divisible by the alignment 8 of cp=2, tp=4, sp=True. Fix: use a multiple of 8 for "
        "seq_length (e.g. 96 or 104), or change cp=2, tp=4, sp=True"
    )
    assert PackingSpec(seq_length=104, cp=2, tp=4, sp=True).alignment == 8


def test_one_docstring_per_knob():
    assert list(KNOB_DOCS) == list(spec_knobs()) == list(DEFAULTS)
    energon_doc = PackingConfig.__doc__.split("Attributes:", 1)[1]
    assert not [k for k in spec_knobs() if f"\n        {k}: " in energon_doc]  # documented once, in the spec
    assert knob_help("cp") == "the context-parallel size the packs are trained with (1 = off)"


# ------------------------------------------------------------------------------------------------ old names
ACCEPTED = {name: entry for name, entry in OLD_NAMES.items() if entry.accepted}
REFUSED = {name: entry for name, entry in OLD_NAMES.items() if not entry.accepted}


@pytest.mark.parametrize(
    "old,value,same",
    [
        ("width", 4096, {"seq_length": 4096}),
        ("packed_sequence_size", 4096, {"seq_length": 4096}),
        ("pad_multiple", 1, {}),
        ("pad_multiple", 8, {"cp": 4}),
        ("pad_multiple", 3, {"tp": 3, "sp": True}),
        ("pad_seq_to_mult", 4, {"cp": 2}),
    ],
)
def test_accepted_old_names_warn_once_naming_the_new_knob(old, value, same):
    base = {} if "seq_length" in same else {"seq_length": 4104}  # 4104: a multiple of 8 and of 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = PackingSpec(**base, **{old: value})
    assert [w.category for w in caught] == [DeprecationWarning]
    assert str(caught[0].message).startswith(f"PackingSpec: {old!r} is deprecated, use {OLD_NAMES[old].new!r}")
    assert caught[0].filename == __file__  # at the caller's line
    assert spec == PackingSpec(**base, **same)
    assert spec.alignment == (value if old.startswith("pad_") else 1)


def test_every_old_name_is_covered_and_says_the_new_knob():
    assert set(ACCEPTED) == {"width", "packed_sequence_size", "pad_multiple", "pad_seq_to_mult"}
    for old, entry in REFUSED.items():
        with pytest.raises(ConfigError) as err:
            PackingSpec(**{old: 1})
        assert err.value.knob == old and err.value.fix == f"use {entry.new}", old
        assert all(k in DEFAULTS for k in entry.new.split("/")), old
    with pytest.raises(ConfigError, match="^on_oversize: is not a knob of PackingConfig"):
        PackingConfig(on_oversize="error")
    with pytest.raises(ConfigError, match=r"^width: was given together with seq_length\. Fix: pass seq_length only"):
        PackingSpec(width=4096, seq_length=4096)


def test_old_names_on_the_energon_and_sft_roads():
    lengths = np.array([10, 20, 30, 500])
    with pytest.warns(
        DeprecationWarning, match="TokenBudgetBatchSampler: 'pad_multiple' is deprecated, use 'cp/tp/sp'"
    ):
        old = TokenBudgetBatchSampler(lengths, 64, pad_multiple=4)
    new = TokenBudgetBatchSampler(lengths, 64, cp=2)
    assert old.pad_multiple == new.pad_multiple == 4 and old.plan() == new.plan()
    assert old.state_dict()["config"] == new.state_dict()["config"]  # the same resume keys as before the rename
    with pytest.raises(ConfigError, match="^pad_to_max_length: is not a packing knob of TokenBudgetBatchSampler"):
        TokenBudgetBatchSampler(lengths, 64, pad_to_max_length=True)
    with pytest.warns(DeprecationWarning, match="PackingConfig.build: 'width' is deprecated|PackingConfig: 'width'"):
        built = PackingConfig.build(width=1024, packing_mode="rounds")
    assert (built.seq_length, built.balance) == (1024, "tokens")


# ------------------------------------------------------------------------------------------------ one default rule
def test_one_balance_default_rule_on_every_road():
    assert default_balance() == "compute" and default_balance(("packing_mode='rounds'",)) == "tokens"
    assert PackingSpec().balance == "compute" and PackingSpec().balance_defaulted
    assert PackingSpec(balance="tokens").balance_defaulted is False
    # Energon: the encoder's config, its rounds mode and the tokens-only packer's knobs
    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(tokenizer="demo", preset=get_preset("qwen2.5-vl"), seq_length=4096)
    assert encoder.packing.balance == "compute"
    assert PackingConfig(packing_mode="rounds").balance == PackingConfig(min_fill=0.9).balance == "tokens"
    assert PackingConfig.build(PackingConfig(), packing_mode="rounds").balance == "tokens"  # re-derived
    # SFT: the sampler (also built from a spec), and its resume of a state in the other mode
    sampler = TokenBudgetBatchSampler(np.array([10, 20, 30]), 64)
    assert sampler.balance == "compute" and sampler._balance_defaulted
    assert TokenBudgetBatchSampler.from_spec(np.array([10, 20]), PackingSpec(seq_length=64)).balance == "compute"
    # CLI: every spec flag defaults to the spec's value, so parsed flags build the default spec
    from energon_pack.cli.options import SPEC_ARGS, spec_options

    parser = argparse.ArgumentParser()
    spec_options(parser, *SPEC_ARGS)
    parsed = vars(parser.parse_args([]))
    assert set(SPEC_ARGS) == set(spec_knobs()) - {"overlength"} and parsed == {k: DEFAULTS[k] for k in SPEC_ARGS}
    assert PackingSpec(**parsed).balance == "compute"


def test_cli_old_flags_still_work_and_say_once_that_they_are_deprecated(tmp_path, capsys):
    from energon_pack.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "a {i}", "completion": "b"}}\n' for i in range(3)))
    args = ["inspect", str(data), "--tokenizer", "demo", "--json-out", str(tmp_path / "r.json")]
    assert main([*args, "--width", "64", "--pad-multiple", "4"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "energon-pack inspect: --width is deprecated, use --seq-length",
        "energon-pack inspect: --pad-multiple is deprecated, use --cp/--tp/--sp (the alignment is derived from them)",
    ]
    report = {k: v for k, v in json.loads((tmp_path / "r.json").read_text()).items() if k != "cache"}
    assert report["packing"]["pad_multiple"] == 4 and report["packing"]["width"] == 64
    assert main([*args, "--seq-length", "64", "--cp", "2"]) == 0
    assert capsys.readouterr().err == ""
    assert {k: v for k, v in json.loads((tmp_path / "r.json").read_text()).items() if k != "cache"} == report


def test_in_batch_packer_layout_from_the_spec():
    class Dataset:
        pad_token_id = 7

    spec = PackingSpec(seq_length=64, cp=2, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=4)
    packer = InBatchPacker.for_dataset(Dataset(), 64, cp=2, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=4)
    assert packer.layout == ThdLayout.from_spec(spec, pad_token_id=7) == InBatchPacker.from_spec(Dataset(), spec).layout
    assert (packer.layout.pad_multiple, packer.layout.pad_token_id) == (4, 7)


# ------------------------------------------------------------------------------------------------ resume keys
def test_the_energon_fingerprint_keys_are_unchanged():
    knobs = {f.name for f in dataclasses.fields(PackingConfig)} - set(RESUME_SAFE_KNOBS)
    assert knobs == {
        "seq_length", "cp", "tp", "sp", "eval_cp", "pad_to_max_length", "pad_cu_seqlens", "max_segments",
        "max_media_per_pack", "max_patches_per_pack", "packing_mode", "lookahead_packs", "min_fill", "max_age",
        "overlength", "balance", "cost_model", "seed",
    }  # fmt: skip
    assert PackingConfig(cp=2).layout().pad_multiple == 4 and PackingConfig().capacity() == (8192,)


# ------------------------------------------------------------------------------------------------ no knob tables
#: the roads built from the spec: none declares a spec knob with a literal default (a signature, a dataclass field
#: or a CLI flag) again; they take the spec's knobs as ``**knobs``, subclass it, or read ``DEFAULTS``
ROADS = [
    "energon/config.py",
    "energon/task_encoder.py",
    "qwen_vl/task_encoder.py",
    "sft/sampler.py",
    "sft/collate.py",
    "sft/dataset.py",
    *(f"cli/{name}.py" for name in ("options", "common", "pack_offline", "inspect", "demo")),
    *(f"cli/{name}.py" for name in ("bench", "bench_offline", "bench_packing", "bench_pixels", "bench_sft")),
    *(f"integrations/bridge/{p.name}" for p in sorted((PACKAGE / "integrations" / "bridge").glob("*.py"))),
]
#: (module, knob): declarations that are not the packing knob (each says why)
NOT_THE_KNOB = {
    ("cli/bench_packing.py", "seed"): "the seed of the generated synthetic mixes",
    ("cli/inspect.py", "pad_multiple"): "the deprecated --pad-multiple alias (no default of its own)",
    ("cli/pack_offline.py", "pad_seq_to_mult"): "Bridge's explicit offline pad_seq_to_mult, a multiple of the rule",
    ("integrations/bridge/gpt_sft.py", "packed_sequence_size"): "the check's PackedSequenceSpecs value (None: unset)",
    ("integrations/bridge/gpt_sft.py", "pad_seq_to_mult"): "the check's alignment in use (None: the topology's lcm)",
}


def knob_declarations(source: str) -> list[tuple[str, int]]:
    """(knob, line) of each spec knob or old name declared with a literal default: a function parameter, a class
    field, or an ``add_argument`` of its flag."""
    knobs = set(spec_knobs()) | set(OLD_NAMES)
    flags = {"--" + k.replace("_", "-"): k for k in knobs}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [
                *zip(positional[len(positional) - len(a.defaults) :], a.defaults),
                *zip(a.kwonlyargs, a.kw_defaults),
            ]
            found += [(arg.arg, node.lineno) for arg, d in pairs if arg.arg in knobs and isinstance(d, ast.Constant)]
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.value, ast.Constant):
                    found += [(st.target.id, st.lineno)] if getattr(st.target, "id", None) in knobs else []
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            found += [
                (flags[a.value], node.lineno) for a in node.args if isinstance(a, ast.Constant) and a.value in flags
            ]
    return found


def test_the_scan_finds_a_knob_table():
    table = "def road(x, seq_length: int = 4096, *, seed=0, **kw): ...\nclass C:\n    balance: str = 'compute'\n"
    flags = "p.add_argument('--width', type=int, default=4096)\n"
    assert knob_declarations(table + flags) == [("seq_length", 1), ("seed", 1), ("balance", 3), ("width", 4)]
    assert knob_declarations("def road(x, seq_length, overlength=DEFAULTS['overlength'], **knobs): ...") == []


def test_no_road_declares_a_knob_with_its_default_again():
    found = [
        f"{module}:{line}: {knob}"
        for module in ROADS
        for knob, line in knob_declarations((PACKAGE / module).read_text())
        if (module, knob) not in NOT_THE_KNOB
    ]
    assert found == [], "declare packing knobs once, in energon_pack/packing/spec.py (PackingSpec)"


def test_old_names_on_the_energon_encoders_warn_at_the_users_line():
    """TextPackingTaskEncoder picked config keywords by field name only (``width=`` never reached the config);
    both encoders route old names through the spec's table, warning once at the caller's line."""
    from energon_pack.energon.text import TextPackingTaskEncoder
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    for cls in (TextPackingTaskEncoder, QwenVLPackingTaskEncoder):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            encoder = cls(tokenizer="demo", width=1024, pad_multiple=4)
        deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert [str(w.message) for w in deprecations] == [
            f"{cls.__name__}: 'width' is deprecated, use 'seq_length' (width=1024 is seq_length=1024)",
            f"{cls.__name__}: 'pad_multiple' is deprecated, use 'cp/tp/sp' (pad_multiple=4 is cp=2; the alignment "
            "is derived from them: pad_multiple=2*N is cp=N)",
        ]
        assert [w.filename for w in deprecations] == [__file__, __file__]
        assert (encoder.packing.seq_length, encoder.packing.cp, encoder.packing.alignment) == (1024, 2, 4)
    with pytest.raises(ConfigError, match="^max_seq_length: is not a knob of TextPackingTaskEncoder"):
        TextPackingTaskEncoder(tokenizer="demo", max_seq_length=1024)
