"""examples/train_hf.py: a tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL trained on CPU from the real loader's packs.

The example's ``main`` runs in this process (one import of torch and transformers for the three versions) at width
1024 for 2 steps on small demo shards: one finite loss line per step, the losses it returns, the real vocabulary.
"""

import importlib.util
import math
import re
from pathlib import Path

import pytest

from _hf_helpers import NO_IMPLICIT_PREPARE

pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_hf.py"
STEP_LINE = re.compile(r"^step (\d+)  loss (\S+)  tokens (\d+)  supervised (\d+)  segments (\d+)", re.M)


def _load():
    spec = importlib.util.spec_from_file_location("train_hf", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_hf = _load()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from energon_pack.energon import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("train_hf") / "data", samples=80, per_shard=20)


@pytest.mark.parametrize("preset", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_trains_two_steps_at_width_1024_with_finite_losses(data, preset, capsys):
    losses = train_hf.main(["--data", str(data), "--preset", preset, "--steps", "2", "--seq-length", "1024"])
    out = capsys.readouterr().out
    steps = STEP_LINE.findall(out)
    assert [int(s[0]) for s in steps] == [0, 1] and len(losses) == 2
    assert [float(s[1]) for s in steps] == [float(f"{x:.4f}") for x in losses]
    for _, loss, tokens, supervised, segments in steps:
        # a random model's cross entropy is about ln(151,936) = 11.9 per token
        assert math.isfinite(float(loss)) and 10.0 < float(loss) < 14.0
        assert 0 < int(supervised) < int(tokens) <= 1024 and int(segments) >= 1
    assert f"{preset}: " in out and "(vocabulary 151,936)" in out and "width 1024" in out
    assert re.search(r"^peak RSS \d+\.\d\d GB$", out, re.M)


def test_the_command_line_is_the_documented_one():
    args = train_hf.parse_args([])
    assert (args.data, args.preset, args.steps, args.seq_length, args.device) == (None, "qwen2.5-vl", 3, 8192, "cpu")
    with pytest.raises(SystemExit):
        train_hf.parse_args(["--preset", "qwen2-7b"])
