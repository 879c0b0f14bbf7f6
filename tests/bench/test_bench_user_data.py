"""``energon-pack bench --data`` on a user's dataset (issue 47 item 5): the cells replayed from one pre-encode pass
(the same packs as the loader's), one loader cell for speed, no project targets judged on that data, and one
progress display (Energon's own fill bar never drawn). Real megatron-energon loader on demo shards written here."""

import json

from energon_pack.cli import main
from energon_pack.energon.demo_data import make_demo_shards


def test_bench_on_user_data_replays_one_pre_encode_pass_and_judges_no_targets(tmp_path, capfd):
    data = make_demo_shards(tmp_path / "d", samples=40, per_shard=20, seed=1)
    out = tmp_path / "out"
    args = ["bench", "--data", str(data), "--out-dir", str(out), "--no-plots", "--tokenizer", "demo"]
    assert main(args + ["--buffers", "1,8", "--packs", "5"]) == 0
    printed = capfd.readouterr()
    lines = printed.out.splitlines()
    assert lines[1] == (
        "sweep: 4 cells (2 modes x 2 K) x 5 packs, packed from costs pre-encoded once (token counts and media "
        "headers, no pixels); then one loader cell for speed, latency and memory"
    )
    assert lines[2].startswith("pre-encode: 40 samples in ")
    assert lines[3] == "loader cell: carry K=8 (5 packs), pixels decoded as in training"
    assert "target" not in printed.out and "Filling reading buffer" not in printed.err
    result = json.loads((out / "buffer_sizes.json").read_text())
    assert result["targets"] == [] and result["recommended_k"] == 8
    replayed = {(c["mode"], c["buffer"]): c for c in result["cells"]}
    loader = result["loader_cell"]
    # the replayed carry K=8 cell packs exactly what the loader delivered: same packs, samples and tokens
    assert (loader["mode"], loader["buffer"], loader["packs"]) == ("carry", 8, 5)
    for key in ("packs", "samples", "real_tokens", "slots"):
        assert replayed["carry", 8][key] == loader[key], key
    assert [replayed["carry", 1][k] for k in ("packs", "samples")] == [5, 5]
    table = (out / "buffer_sizes.md").read_text()
    assert table.startswith("Cells replayed from one pre-encode pass (no speed columns); through the loader:")
    assert "nan" not in table and table.count("| carry | 8 |") == 2
    # --check judges the project's targets on its demo data, not on yours
    assert main(args + ["--check"]) == 2
    assert "--check judges the project's own targets on its demo data" in capfd.readouterr().err


def test_bench_loader_cells_on_user_data_one_k_rounds_draw_one_progress(tmp_path, capfd):
    data = make_demo_shards(tmp_path / "d", samples=40, per_shard=20, seed=1)
    args = ["bench", "--data", str(data), "--out-dir", str(tmp_path / "out"), "--no-plots", "--tokenizer", "demo"]
    assert main(args + ["--loader-cells", "--modes", "rounds", "--buffers", "8", "--packs", "3"]) == 0
    printed = capfd.readouterr()
    assert "Filling reading buffer" not in printed.err  # Energon's bar: our rounds wrapper never draws it
    assert "rounds K=8" in printed.err  # our own bar, the one display
    assert "target" not in printed.out  # one K on user data: no targets, no empty heading
    assert "no recommended K: only K=8 was measured (rounds)" in printed.out


def test_pre_encode_stops_at_what_the_packs_can_hold_and_the_packs_are_the_same(tmp_path):
    from energon_pack.bench.buffer_sweep import preencode_costs, replay_cell
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    data = make_demo_shards(tmp_path / "d", samples=40, per_shard=20, seed=1)
    whole, _, read_all = preencode_costs(data, workers=2, tokenizer="demo")
    capped, _, read_capped = preencode_costs(data, workers=2, packs=2, max_buffer=2, tokenizer="demo")
    assert (read_all, read_capped) == (True, False)
    assert {w: len(s) for w, s in whole.items()} == {0: 20, 1: 20}
    assert {w: len(s) for w, s in capped.items()} == {0: 15, 1: 15}  # 8,192 tokens each, then 2 more
    assert all(capped[w] == whole[w][:15] for w in whole)  # the same streams, cut
    encoder = QwenVLPackingTaskEncoder(tokenizer="demo", packing_mode="carry")
    for mode in ("carry", "rounds"):
        for k in (1, 2):
            a, b = (replay_cell(s, mode=mode, buffer=k, packs=2, encoder=encoder, workers=2) for s in (whole, capped))
            assert (a.packs, a.samples, a.real_tokens) == (b.packs, b.samples, b.real_tokens) and a.packs == 2
