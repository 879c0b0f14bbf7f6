"""``energon-pack convert``: your own VLM SFT data -> prepared Energon WebDataset shards, in one command.

Inputs (the layouts most published VLM SFT sets use), detected from the content:

- ``llava``: a JSON array (or JSONL) of ``{"id", "image": "a.jpg" | "images": [...],
  "conversations": [{"from", "value"}, ...]}`` with ``<image>`` placeholders;
- ``sharegpt``: the same turns (``conversations`` from/value), optional ``images`` list;
- ``messages``: OpenAI-style ``{"messages": [{"role", "content"}, ...], "images": [...]}``, content a
  string (``<image>`` placeholders) or typed parts (``{"type": "image"}``, ``{"type": "image",
  "image": "a.jpg"}``, ``{"type": "image_url", "image_url": {"url": "data:..."}}``); tool calls
  (``content: null`` + ``tool_calls``, ``role: "tool"``) are kept as given;
- LLaMA-Factory's ShareGPT files are ``sharegpt`` / ``messages``: ``function_call`` / ``observation``
  turns, ``tools`` as a JSON string and a top-level ``system`` are read by the loader's own rules;
- ``alpaca`` (LLaMA-Factory's default): ``{"instruction", "input", "output", "system", "history",
  "images"}``, written as ``messages`` turns (:func:`~energon_pack.chat.conversation.alpaca_turns`);
- ``parquet``: one ``.parquet`` file or a folder of them, with a ``messages`` / ``conversations`` /
  ``texts`` column and an ``images`` / ``image`` column (``{"bytes", "path"}`` structs or binary).

A LLaMA-Factory dataset is read by its name in ``dataset_info.json`` (``data/dataset_info.json#mllm_demo``:
its file, formatting, columns and tags, :mod:`.dataset_info`).

An image value is a path (relative paths resolve against ``image_root``; without it, against the first
folder that holds them of those :func:`~.media.media_roots` guesses: the source's folder, its
``dataset_info.json`` folder, the current folder), a ``{"path"}`` / ``{"bytes"}`` dict, raw bytes or a
``data:`` URI. Images are stored with their ORIGINAL encoded bytes (never re-encoded), named by the format sniffed from
the bytes. Videos (LLaVA-Video / ShareGPT ``"video"`` / ``"videos"`` with ``<video>``
placeholders, ``{"type": "video", "video": ...}`` parts, Parquet ``video`` columns) take the same
values and are copied byte for byte too, after the header check the loader's costing needs
(:func:`~energon_pack.video.probe_video`: a video stream with a rate, a size and >= 2 frames),
named ``mp4`` (MP4/MOV), ``mkv`` (Matroska/WebM) or ``avi`` by their container. Output layouts:

- ``ours``: ``KEY.json`` (the record without its image / video fields) + ``KEY.0.jpg``,
  ``KEY.1.png``, ... and ``KEY.0.mp4``, ... in placeholder order;
- ``bridge``: Megatron-Bridge's ChatML layout, ``KEY.json`` + ``KEY.jpgs`` (a pickled list of the
  encoded images) + ``KEY.videos`` (a pickled empty list), as Bridge's preparers write it. The
  pickles are there for Bridge's own reader; ours loads them without running code
  (:func:`~energon_pack.energon.chatml.unpickle_media`), and ``ours`` needs no pickle at all.
  A video becomes a frame list there: the frames qwen-vl-utils' default sampling takes (2 per
  second, 4 to 768, :mod:`energon_pack.video.sampling`), decoded, resized to the size ``preset``'s
  frame-list rule trains them at (default qwen2.5-vl) and stored as JPEG (quality 95, 4:4:4) in
  ``KEY.videos``; the frame rate of the file is not kept (readers assume 2 frames per second).

Each distinct media file is stored once (``--media-store dedup``, the default of ``ours``): keyed by the SHA-256 of its
bytes (two paths to one file, or one file under two names, count once), it is a member of the first record that
uses it, and each later record holds a ``media_refs.json`` member naming that member and its SHA-256 instead of a
copy (:mod:`.dedup`). The loader reads them back in its workers through Energon's own random-access store of the
dataset (a ``@cooker(need_primary=True)`` selected by the ``dataset.yaml`` subflavor convert writes:
:mod:`energon_pack.energon.media_store`), so the samples, packs and resume are those of ``--media-store inline``
(a copy in every record: self-contained samples, and the only store of ``bridge``, whose reader takes the media
from the sample). Energon's ``aux:`` sources would need a Metadataset yaml in front of the folder; the primary
store keeps ``get_train_dataset(out_dir, ...)`` and every record a sample.

Image paths are read only inside the source's folder and ``image_root`` (resolved, symlinks
included), only from regular files up to ``max_media_mb``, and only past an image header.

Then :func:`~energon_pack.energon.prepare.prepare_webdataset` indexes the shards (in pure Python, the files
``energon prepare`` writes: :mod:`energon_pack.energon.index_writer`), so ``get_train_dataset(out_dir, ...)``
works at once. Every unusable record is a counted skip
with a reason and examples (:data:`SKIP_REASONS`); ``written + skipped == records``; a run that lost a whole
media kind or more than ``--max-skipped-share`` of its records exits with status 2 after writing it all. Each written
record has passed the loader's own structural checks on the very JSON written
(:func:`~energon_pack.chat.conversation.check_conversation`: turns, roles, tool calls, an assistant
turn, placeholders against images), under the loader's reason names; what is left to the loader
depends on its settings (the tokenizer, the preset's tool support, image and width limits).
"""

from __future__ import annotations

from .command import build_parser, main
from .detect import detect_format
from .options import FORMATS, LAYOUTS
from .shards import convert
from .summary import SKIP_REASONS, ConvertSummary

__all__ = ["FORMATS", "LAYOUTS", "SKIP_REASONS", "ConvertSummary", "build_parser", "convert", "detect_format", "main"]
