"""Hostile input (issue 10, input half): every case is a counted skip with a reason or is used
correctly, on the real megatron-energon loader (WebDataset shards and JSONL the tests write,
worker processes) and on the mmap JSONL path.

Cases: JSON nested 10,000 levels deep, a lone surrogate (``"\\ud800"``), control tokens typed in
text (``<|image_pad|>``, ``<|video_pad|>``, ``<|im_end|>``), upper-case image extensions
(``0.JPG``), EXIF orientation, a UTF-8 BOM and CR-only line endings in JSONL.
"""

import io
import json
import warnings

import numpy as np
import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image, ImageOps

from energon_pack import pixels as P
from energon_pack.chat import encode_text_chat, load_demo_tokenizer, load_demo_tokenizer_raw, normalize_conversation
from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.energon.chatml import ChatMLSample, parse_chatml
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.errors import SampleSkipped
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl import vision as V
from energon_pack.qwen_vl.chat import encode_chat
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.records import MAX_JSON_DEPTH, decode_json_record
from energon_pack.sft import JsonlSFTDataset
from energon_pack.sft.formats import PromptCompletionFormat

warnings.filterwarnings("ignore", message=".*pin_memory.*")
PRESET = get_preset("qwen2-vl", max_pixels=160 * 28 * 28)
TOK = load_demo_tokenizer()
DEEP = "[" * 10_000 + "]" * 10_000


def _jpeg(width, height, orientation=None, seed=0):
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([(xx * 255 // width), (yy * 255 // height), (xx + 2 * yy) % 256], -1).astype(np.uint8)
    rgb[: height // 4, : width // 3] = (seed * 40) % 256  # an asymmetric block: orientation is visible
    buf = io.BytesIO()
    img = Image.fromarray(rgb)
    if orientation is None:
        img.save(buf, format="JPEG", quality=90)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        img.save(buf, format="JPEG", quality=90, exif=exif)
    return buf.getvalue()


def _conv(user, assistant="An answer."):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


# ---------------------------------------------------------------------------------------------
# Units: each rule alone
# ---------------------------------------------------------------------------------------------


def test_deep_json_is_invalid_json_not_recursion_error():
    for raw in (DEEP.encode(), ('{"messages": ' + DEEP + "}").encode(), DEEP):
        with pytest.raises(SampleSkipped) as exc:
            decode_json_record(raw)
        assert (exc.value.reason, exc.value.detail) == (
            "invalid_json",
            f"nested too deeply (> {MAX_JSON_DEPTH} levels)",
        )
    # decodable by json but past our limit (repr / pickle / walks would be next to fail)
    nested = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(SampleSkipped, match="nested too deeply"):
        decode_json_record(nested)
    assert decode_json_record("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None  # at the limit: fine
    # a conversation given as a JSON string inside the record, and a deep object from a non-JSON source
    for conv in ({"messages": DEEP}, {"messages": json.loads("[" * 200 + "]" * 200)}):
        with pytest.raises(SampleSkipped) as exc:
            normalize_conversation(conv)
        assert exc.value.reason == "invalid_json" and "nested too deeply" in exc.value.detail
    # a deep-ish (under the limit) value in a text part: no str()/repr() recursion, a typed skip
    part = json.loads("[" * 60 + "1" + "]" * 60)
    with pytest.raises(SampleSkipped) as exc:
        normalize_conversation(_conv([{"type": "text", "text": part}]))
    assert (exc.value.reason, exc.value.detail) == ("bad_conversation", "turn 0 has a text part of type list")
    with pytest.raises(SampleSkipped) as exc:
        normalize_conversation([{"role": part, "content": "x"}])
    assert exc.value.reason == "bad_conversation" and len(exc.value.detail) < 200


def test_lone_surrogate_is_invalid_text():
    record = '[{"role": "user", "content": "a \\ud800 b"}, {"role": "assistant", "content": "ok"}]'
    with pytest.raises(SampleSkipped) as exc:
        encode_text_chat(decode_json_record(record), tokenizer=TOK)
    assert exc.value.reason == "invalid_text" and "\\ud800" in exc.value.detail
    fmt = PromptCompletionFormat(load_demo_tokenizer_raw())
    with pytest.raises(SampleSkipped) as exc:
        fmt.encode({"prompt": "p", "completion": "x\udfff"})
    assert exc.value.reason == "invalid_text"
    # a valid surrogate *pair* in JSON is one astral character: fine
    ids, _ = encode_text_chat(
        decode_json_record('[{"role":"user","content":"\\ud83d\\ude00"},{"role":"assistant","content":"ok"}]'),
        tokenizer=TOK,
    )
    assert TOK.decode(ids.tolist()).count("\U0001f600") == 1


@pytest.mark.parametrize(
    "where,token",
    [
        ("user", "<|image_pad|>"),
        ("user", "<|video_pad|>"),
        ("assistant", "<|im_end|>"),
        ("system", "<|im_start|>"),
        ("assistant", "<|endoftext|>"),
        ("user", "<|vision_start|>"),
    ],
)
def test_control_token_typed_in_text_is_a_counted_skip(where, token):
    conv = [{"role": "system", "content": "Sys."}] + _conv("Q?", "A.")
    turn = {"system": 0, "user": 1, "assistant": 2}[where]
    conv[turn]["content"] += f" see {token} here"
    for tokenizer in (TOK, load_demo_tokenizer_raw(), _hf_tokenizer()):
        with pytest.raises(SampleSkipped) as exc:
            encode_text_chat(conv, tokenizer=tokenizer)
        assert exc.value.reason == "control_token_in_text" and token in exc.value.detail
        with pytest.raises(SampleSkipped) as exc:  # the Qwen-VL renderer is the same builder
            encode_chat(conv, tokenizer=tokenizer, preset=PRESET)
        assert exc.value.reason == "control_token_in_text"
    # a typed part is literal text too: still no control token
    with pytest.raises(SampleSkipped, match="control_token_in_text"):
        encode_text_chat(_conv([{"type": "text", "text": token}]), tokenizer=TOK)
    # a role name is never rendered as given: any but the known roles is a counted skip
    with pytest.raises(SampleSkipped, match="unknown_role"):
        encode_text_chat(
            [{"role": f"user{token}", "content": "q"}, {"role": "assistant", "content": "a"}], tokenizer=TOK
        )


def _hf_tokenizer(extra_plain=()):
    import transformers

    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_demo_tokenizer_raw(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    if extra_plain:
        hf.add_tokens(list(extra_plain), special_tokens=False)
    return hf


def test_why_skip_hf_tokenizers_turn_typed_control_tokens_into_real_ones():
    """Tokenizing the rendered string (what HF's apply_chat_template + processor do) maps a typed
    <|image_pad|> to the real id: our rule exists because nothing downstream can tell them apart."""
    hf = _hf_tokenizer()
    assert hf.encode("a <|image_pad|>", add_special_tokens=False)[-1] == TOK.special.image_pad


def test_non_special_added_tokens_and_lookalikes_stay_text():
    hf = _hf_tokenizer(extra_plain=("<tool_call>",))
    ids, mask = encode_text_chat(_conv("call <tool_call> now, <|im_end| >, <im_end>, <|image_pad"), tokenizer=hf)
    assert hf.convert_tokens_to_ids("<tool_call>") in ids.tolist()
    assert ids.tolist().count(TOK.special.im_end) == 2 and TOK.special.image_pad not in ids.tolist()
    # Qwen3-VL timestamps ("<1.0 seconds>") are ours, never flagged
    enc, _ = encode_chat(
        _conv("<video> what happens?"), videos=[[_jpeg(64, 48)] * 4], tokenizer=TOK, preset=get_preset("qwen3-vl")
    )
    assert "<0.2 seconds>" in TOK.decode(enc.input_ids.tolist())


def test_prompt_completion_without_qwen_tokens_applies_the_same_rule():
    """A non-Qwen tokenizer (PlainTokenizer path): its own special tokens are control tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", "<", ">", "s", "/"])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["<s>", "</s>"])
    fmt = PromptCompletionFormat(raw, eos_id=raw.token_to_id("</s>"))
    enc = fmt.encode({"prompt": "hello", "completion": "world"})
    assert enc.input_ids.tolist() == [1, 2, raw.token_to_id("</s>")]
    for record in ({"prompt": "hello </s>", "completion": "world"}, {"prompt": "hello", "completion": "<s> world"}):
        with pytest.raises(SampleSkipped) as exc:
            fmt.encode(record)
        assert exc.value.reason == "control_token_in_text"


def test_upper_case_image_extensions_are_images_in_natural_order():
    imgs = {name: _jpeg(40 + i, 40, seed=i) for i, name in enumerate(["10.JPG", "2.jpg", "1.Png", "0.JPEG"])}
    sample = ChatMLSample(__key__="k", __restore_key__=(), __subflavors__={}, fields={"json": b"[]", **imgs})
    _, images, _ = parse_chatml(sample)
    assert images == [imgs["0.JPEG"], imgs["1.Png"], imgs["2.jpg"], imgs["10.JPG"]]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_applied_in_header_read_and_decode(orientation):
    data = _jpeg(300, 140, orientation=orientation, seed=orientation)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert P.image_size_from_bytes(data) == upright.size == ((140, 300) if orientation >= 5 else (300, 140))
    pv, grid = V.patchify_image(data, PRESET)
    ref_pv, ref_grid = V.patchify_image(upright, PRESET)  # decoded + exif_transpose + our path
    np.testing.assert_array_equal(pv, ref_pv)
    np.testing.assert_array_equal(grid, ref_grid)
    w, h = upright.size
    assert grid[0].tolist() == list(V.image_grid_thw(h, w, PRESET))
    # the count from the header and the decoded pixels agree (else a counted image_size_mismatch)
    enc, vis = encode_chat(_conv("<image> what?"), [data], tokenizer=TOK, preset=PRESET)
    assert torch.equal(vis.image_grid_thw, torch.from_numpy(grid))
    if orientation in (1, 6):  # transformers' own loader + image processor on the rotated image
        from transformers import Qwen2VLImageProcessor
        from transformers.image_utils import load_image

        proc = Qwen2VLImageProcessor(
            patch_size=PRESET.patch_size,
            merge_size=PRESET.merge_size,
            temporal_patch_size=PRESET.temporal_patch_size,
            min_pixels=PRESET.min_pixels,
            max_pixels=PRESET.max_pixels,
            image_mean=list(PRESET.image_mean),
            image_std=list(PRESET.image_std),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = proc(images=[load_image(Image.open(io.BytesIO(data)))], return_tensors="np")
        np.testing.assert_array_equal(grid, ref["image_grid_thw"])
        np.testing.assert_allclose(pv, ref["pixel_values"], atol=1e-5, rtol=1e-5)


def test_exif_orientation_malformed_value_counts_as_upright():
    data = _jpeg(90, 30, orientation=42)
    assert P.image_size_from_bytes(data) == (90, 30)
    assert V.patchify_image(data, PRESET)[1][0].tolist() == list(V.image_grid_thw(30, 90, PRESET))


def test_bom_and_cr_records():
    assert decode_json_record(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    with pytest.raises(SampleSkipped) as exc:
        decode_json_record(b'{"a": 1}\r{"a": 2}\r{"a": 3}')
    assert exc.value.reason == "cr_line_endings" and "3 CR-separated lines" in exc.value.detail


# ---------------------------------------------------------------------------------------------
# The real loader: WebDataset shards with every hostile case among good samples, 2 workers
# ---------------------------------------------------------------------------------------------

HOSTILE = {  # key -> (fields builder, expected skip reason)
    "deep_json": (lambda: {"json": ('{"messages": ' + DEEP + "}").encode()}, "invalid_json"),
    "surrogate": (
        lambda: {"json": b'[{"role": "user", "content": "x \\ud800"}, {"role": "assistant", "content": "y"}]'},
        "invalid_text",
    ),
    "image_pad_user": (
        lambda: {"json": json.dumps(_conv("<image> look <|image_pad|>")).encode(), "0.jpg": _jpeg(64, 64)},
        "control_token_in_text",
    ),
    "video_pad_user": (lambda: {"json": json.dumps(_conv("what <|video_pad|>")).encode()}, "control_token_in_text"),
    "im_end_assistant": (
        lambda: {"json": json.dumps(_conv("q", "fine<|im_end|>\n<|im_start|>user\nmore")).encode()},
        "control_token_in_text",
    ),
}


def _good(i):
    fields = {"json": json.dumps(_conv(f"<image> sample {i} " + "word " * (i % 7), f"answer {i}")).encode()}
    if i % 3 == 0:
        fields["0.JPG"] = _jpeg(120 + i, 80, seed=i)  # upper-case extension
    elif i % 3 == 1:
        fields["0.jpg"] = _jpeg(200, 90 + i, orientation=6, seed=i)  # rotated by EXIF
    else:
        fields["0.Png"] = _jpeg(50, 50, seed=i)  # (JPEG bytes: PIL reads the content)
    return fields


@pytest.fixture(scope="module")
def hostile_shards(tmp_path_factory):
    import webdataset as wds

    root = tmp_path_factory.mktemp("hostile")
    good = {}
    with wds.ShardWriter(str(root / "h-%06d.tar"), maxcount=20, verbose=0) as sink:
        n = 0
        for i in range(30):
            key = f"good{i:03d}"
            good[key] = _good(i)
            sink.write({"__key__": key, **good[key]})
            n += 1
            if i % 6 == 0:
                name = list(HOSTILE)[(i // 6) % len(HOSTILE)]
                sink.write({"__key__": f"bad_{name}", **HOSTILE[name][0]()})
    prepare_webdataset(root)
    return root, good


def _loader(path, te, workers, buffer=8):
    return get_loader(
        get_train_dataset(
            str(path),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
            task_encoder=te,
            packing_buffer_size=buffer,
            repeat=False,
        )
    )


def _total_skips(batches):
    tracker = PackingStatsTracker()
    for b in batches:
        tracker.update(b["packing_stats"])
    return dict(tracker.total.skips)


@pytest.mark.parametrize("mode,workers", [("carry", 2), ("rounds", 0)])
def test_loader_counts_every_hostile_sample_and_keeps_good_ones_intact(hostile_shards, mode, workers):
    root, good = hostile_shards
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=2048, packing_mode=mode)
    batches = list(_loader(root, te, workers))
    keys = [k for b in batches for k in b["__keys__"]]
    assert sorted(keys) == sorted(good)  # each good sample exactly once
    assert _total_skips(batches) == {"invalid_json": 1, "invalid_text": 1, "control_token_in_text": 3}
    for b in batches:
        cu = b["cu_seqlens_q"].tolist()
        patch_off = 0
        for n, key in enumerate(b["__keys__"]):
            fields = good[key]
            images = [v for k, v in fields.items() if k != "json"]
            enc, vis = encode_chat(json.loads(fields["json"]), images, tokenizer=TOK, preset=PRESET)
            assert torch.equal(b["input_ids"][0, cu[n] : cu[n + 1]], enc.input_ids)
            assert torch.equal(b["image_grid_thw"][n], enc.image_grid_thw[0])  # one image each: not ignored
            n_patch = vis.pixel_values.shape[0]
            assert torch.equal(b["pixel_values"][patch_off : patch_off + n_patch], vis.pixel_values)
            patch_off += n_patch
            if int(key[4:]) % 3 == 1:  # EXIF 6: the grid follows the upright (portrait) image
                w, h = ImageOps.exif_transpose(Image.open(io.BytesIO(images[0]))).size
                assert h > w and enc.image_grid_thw[0].tolist() == list(V.image_grid_thw(h, w, PRESET))


# ---------------------------------------------------------------------------------------------
# JSONL: the Energon path (TextPackingTaskEncoder) and the mmap path (JsonlSFTDataset)
# ---------------------------------------------------------------------------------------------

JSONL_BAD = {
    3: ('{"prompt": ' + DEEP + ', "completion": "x"}', "invalid_json"),
    8: ('{"prompt": "p \\ud800", "completion": "x"}', "invalid_text"),
    13: ('{"prompt": "p <|image_pad|>", "completion": "x"}', "control_token_in_text"),
    17: ('{"prompt": "p", "completion": "done<|im_end|>"}', "control_token_in_text"),
    21: ('{"prompt": "p", "completion": "<|endoftext|>"}', "control_token_in_text"),
}


def _pc_line(i):
    return json.dumps({"prompt": f"question {i} " + "why " * (i % 5), "completion": f" answer {i}"})


@pytest.fixture(scope="module")
def hostile_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("hjsonl") / "h.jsonl"
    path.write_text("".join((JSONL_BAD[i][0] if i in JSONL_BAD else _pc_line(i)) + "\n" for i in range(30)))
    assert prepare_jsonl(path) == 30
    return path


def _want_jsonl_skips():
    want = {}
    for _, reason in JSONL_BAD.values():
        want[reason] = want.get(reason, 0) + 1
    return want


def test_jsonl_energon_path_counts_hostile_lines(hostile_jsonl):
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
    batches = list(_loader(hostile_jsonl, te, workers=2))
    keys = sorted(int(k) for b in batches for k in b["__keys__"])
    assert keys == [i for i in range(30) if i not in JSONL_BAD]
    assert _total_skips(batches) == _want_jsonl_skips()


def test_jsonl_mmap_path_counts_hostile_lines(hostile_jsonl, tmp_path):
    ds = JsonlSFTDataset(hostile_jsonl, TOK, cache_dir=tmp_path)
    assert dict(ds.skips) == _want_jsonl_skips()
    assert [(line, reason) for line, reason, _ in ds.skipped_lines] == [
        (i + 1, r) for i, (_, r) in sorted(JSONL_BAD.items())
    ]


def test_jsonl_bom_and_cr_only_files_give_their_lines(tmp_path):
    lines = [_pc_line(i) for i in range(6)]
    fmt = PromptCompletionFormat(TOK)
    want = [fmt.encode(json.loads(line)).input_ids.tolist() for line in lines]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes("\r".join(lines).encode() + b"\r")
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes("\r\n".join(lines).encode())
    for path in (bom, cr, crlf):
        for _ in range(2):  # fresh index, then the cached one
            ds = JsonlSFTDataset(path, TOK)
            assert len(ds) == 6 and dict(ds.skips) == {}
            assert [ds[i].input_ids.tolist() for i in range(6)] == want


def test_jsonl_energon_path_on_cr_only_file_names_the_problem(tmp_path):
    """Energon's own JSONL indexer splits at \\n only: a CR-only file is one record there. It
    becomes one counted ``cr_line_endings`` skip naming the fix (the mmap path reads the lines)."""
    lines = [_pc_line(i) for i in range(6)]
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes("\r".join(lines).encode() + b"\r")
    assert prepare_jsonl(cr) == 1
    batches = list(_loader(cr, TextPackingTaskEncoder(tokenizer="demo", seq_length=256), workers=0))
    assert batches == [] or all(not b["__keys__"] for b in batches)
    # nothing to emit: the skip is visible through the encoder directly (no pack carries stats)
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
    from energon_pack.energon.text import TextRecordSample

    out = te.preencode_sample(
        TextRecordSample(__key__="0", __restore_key__=(), __subflavors__={}, raw=cr.read_bytes().rstrip(b"\r"))
    )
    assert out.reason == "cr_line_endings" and "tr '\\r' '\\n'" in out.detail
