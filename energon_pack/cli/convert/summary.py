"""What a conversion reports: the skip reasons it counts and :class:`ConvertSummary`, the figures
``energon-pack convert`` prints and writes to ``convert_summary.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from energon_pack.cli.common import index_files

from .outdir import MANIFEST_FILE, SUMMARY_FILE

#: the shards' names, in source order
SHARD_NAME = "data-%06d.tar"

#: What each skip reason means (docs/guides/your_data.md's table says the same words (a test compares them)).
SKIP_REASONS = {
    "invalid_json": "a JSONL line that is not valid JSON (or nested deeper than 64 levels)",
    "invalid_utf8": "a JSONL line that is not UTF-8",
    "bad_record": "a record that is not a JSON object / table row",
    "no_conversation": "a record without messages / conversations / conversation / texts",
    "bad_conversation": "turns of an unsupported shape (no role/from, a content of an unknown type, a tool call "
    "without a name, tools that are not a list, ...)",
    "unknown_role": "a turn whose role is not system / user / assistant / tool (or an alias: human, gpt, "
    "function_call, observation)",
    "empty_conversation": "a conversation with no turns",
    "no_assistant_turn": "a conversation with no assistant turn: nothing to train on",
    "empty_assistant_turn": "an assistant turn with no content and no tool calls",
    "media_count_mismatch": "the number of <image> placeholders / image parts differs from the number of images",
    "bad_video_ref": "a video value that is neither a path, bytes nor a {path}/{bytes} dict",
    "remote_video": "an http(s) video URL (convert never downloads)",
    "missing_video": "a video path that does not exist under any media root (pass --image-root, which video "
    "paths share)",
    "unreadable_video": "a video path that exists but cannot be read (no permission)",
    "not_a_video": "a file whose first bytes are no video container header (mp4/mov, mkv/webm, avi)",
    "corrupt_video": "video bytes FFmpeg cannot read: no video stream, frame rate, frame or size in the header",
    "video_too_few_frames": "a video of fewer than 2 frames (Qwen's sampling, and so the loader, refuses it)",
    "bad_image_ref": "an image value that is neither a path, bytes, a data: URI nor a {path}/{bytes} dict",
    "remote_image": "an http(s) image URL (convert never downloads)",
    "missing_image": "an image path that does not exist under any media root (pass --image-root)",
    "unreadable_image": "an image path that exists but cannot be read (no permission)",
    "path_outside_root": "an image path that resolves (symlinks included) outside the media roots (the source folder "
    "and --image-root, or the guessed roots) (--allow-outside-paths reads it)",
    "not_a_regular_file": "an image path naming a folder, a FIFO, a device (/dev/zero, /dev/stdin) or a socket",
    "media_too_large": "an image larger than --max-media-mb",
    "not_an_image": "a file whose first bytes are no image header (it is not read further)",
    "invalid_text": "text that cannot be written as UTF-8 (a lone surrogate such as \\ud800)",
    "unexpected_error": "a record that broke convert in an unforeseen way (the example names the exception)",
    "corrupt_image": "image bytes PIL cannot open (empty, garbage, truncated with --verify decode)",
    "unsupported_image_format": "an image format the loader does not read (only jpg, png, webp, bmp, gif, tiff)",
    "empty_line": "a blank JSON array element (two commas in a row)",
    "cr_line_endings": "a JSONL file with old Mac (CR-only) line endings (tr '\\r' '\\n' fixes it)",
    "unsupported_audio": "a record with audio (audios, <audio>, audio parts): audio is not trained here, "
    "drop those records",
    "unsupported_reasoning": "a reasoning part (LLaMA-Factory v1): the rendered templates have no thinking block",
    "unsupported_loss_weight": "a turn loss_weight other than 0 or 1",
    "preference_data": "a chosen/rejected pair (DPO/ORPO/reward, LLaMA-Factory ranking): --preference chosen "
    "writes its chosen answer as SFT",
    "kto_undesirable": "a KTO example labelled false (kto_tag / label): an undesirable answer, never SFT",
    "kto_label_unreadable": "a KTO label that is not true/false, 1/0 or 'true'/'false'",
    "video_too_large": "a video whose frames exceed the pixel caps (energon_pack.video.probe)",
    "video_size_mismatch": "--layout bridge: a decoded frame whose size differs from the header's",
    "empty_video": "--layout bridge: a video the frame plan samples no frame from",
    "extreme_aspect_ratio": "--layout bridge: a video whose aspect ratio the resize rules refuse (over 200:1)",
}
#: the fix of a skip reason when it dominates a run (convert's own; errors.REASON_FIXES for the loader's shared ones)
_CONVERT_FIXES = {
    "missing_image": "pass --image-root DIR, the folder the relative image paths are relative to",
    "missing_video": "pass --image-root DIR, the folder the relative video paths are relative to",
    "path_outside_root": "pass --image-root DIR (the folder holding the media) or --allow-outside-paths",
    "remote_image": "download the images and point the records (or --image-root) at them",
    "remote_video": "download the videos and point the records (or --image-root) at them",
    "media_too_large": "raise --max-media-mb",
}


def skip_fix(skipped: dict) -> str:
    """What to change when ``skipped`` (reason -> count) lost too much: the fix of its most frequent reason."""
    from energon_pack.errors import REASON_FIXES

    top = max(sorted(skipped), key=skipped.get) if skipped else ""
    return _CONVERT_FIXES.get(top) or REASON_FIXES.get(top) or "see the skip reasons and their examples in the summary"


MAX_EXAMPLES = 3


def tool_records_note(tool_records: int, written: int) -> str:
    """What a user must know of written records with tool calls: only the presets whose template renders tools
    train them; the others skip them as ``tool_calls_unsupported`` at load time."""
    from energon_pack.chat.templates import TEMPLATE_TOOL_SUPPORT

    trains = ", ".join(name for name, ok in TEMPLATE_TOOL_SUPPORT.items() if ok)
    skips = " / ".join(name for name, ok in TEMPLATE_TOOL_SUPPORT.items() if not ok)
    return (
        f"{tool_records} of {written} written record(s) hold tool calls or tools: only the {trains} preset trains "
        f"them (the {skips} templates have no tool handling: those records skip as tool_calls_unsupported there)"
    )


@dataclass
class ConvertSummary:
    """What a conversion did: counts, skips by reason (with examples), shards, bytes, time."""

    source: str
    out_dir: str
    format: str  # llava | sharegpt | messages | parquet
    detected: str  # how the input was read, in words
    layout: str
    records: int = 0
    written: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> ["record 3: detail", ...] (up to 3)
    blank_lines: int = 0  # whitespace-only JSONL lines (not records)
    shards: int = 0
    images: int = 0
    image_bytes: int = 0
    videos: int = 0
    video_bytes: int = 0
    tool_records: int = 0  # written records with tool calls or tools
    bytes: int = 0  # size of the written shards
    seconds: float = 0.0
    workers: int = 1
    hints: list = field(default_factory=list)  # one line each: what to change (e.g. pass --image-root)
    media_roots: dict = field(default_factory=dict)  # guessed root -> relative media files found under it
    failed: str = ""  # why the run lost too much (exit status 2), "" when it did not (:func:`losses`)
    media_store: str = "inline"  # dedup: each distinct media file stored once; inline: a copy per use
    media_stored: int = 0  # dedup: distinct media files written (each once)
    media_stored_bytes: int = 0  # ... and their bytes

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "skipped_total": self.skipped_total}

    def format_text(self) -> str:
        """The human report ``energon-pack convert`` prints."""
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"converted {self.source} -> {self.out_dir} (layout {self.layout})",
            f"  input    {self.detected}",
            f"  records  {self.records}: written {self.written}, skipped {self.skipped_total}"
            + (f" ({self.blank_lines} blank lines ignored)" if self.blank_lines else ""),
        ]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  skipped  {reason}: {count}")
            lines.extend(f"             e.g. {ex}" for ex in self.examples.get(reason, []))
        lines.extend(f"  hint     {h}" for h in self.hints)
        if self.media_roots:
            found = ", ".join(f"{n} under {root}" for root, n in self.media_roots.items())
            lines.append(f"  media    relative paths found (no --image-root given, roots guessed): {found}")
        if self.tool_records:
            lines.append(f"  note     {tool_records_note(self.tool_records, self.written)}")
        lines += [
            f"  output   {self.shards} shard(s), {_mb(self.bytes)}; {self.images} image(s), {_mb(self.image_bytes)}"
            + (f"; {self.videos} video(s), {_mb(self.video_bytes)}" if self.videos else "")
            + " (original bytes)",
            *self._media_store_line(),
            f"  time     {self.seconds:.2f} s ({rate:,.0f} records/s, {self.workers} worker(s)); Energon-prepared: "
            f"get_train_dataset({self.out_dir!r}, ...)",
            f"  wrote    {self.out_dir.rstrip('/')}/: {self._shard_names()}, {index_files(self.shards)}, "
            f"{SUMMARY_FILE} (this summary) and {MANIFEST_FILE} (every name written: what --overwrite deletes)",
        ]
        return "\n".join(lines)

    def losses(self, max_skipped_share: float) -> str:
        """Why this run lost too much, "" when it did not: a whole media kind missing (every image record a
        ``missing_image`` skip, or every video one a ``missing_video`` skip), or more than ``max_skipped_share`` of
        the records skipped. Nothing counts at ``max_skipped_share`` 1 (accept anything)."""
        if max_skipped_share >= 1 or not self.records:
            return ""
        what = [
            f"every {kind} record was skipped ({self.skipped[f'missing_{kind}']} missing_{kind}, 0 {kind}s written)"
            for kind, written in (("image", self.images), ("video", self.videos))
            if self.skipped.get(f"missing_{kind}") and not written
        ]
        share = self.skipped_total / self.records
        if share > max_skipped_share:
            what.append(f"{share:.1%} of the records were skipped, over --max-skipped-share {max_skipped_share:g}")
        if not what:
            return ""
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        return (
            f"{self.skipped_total} of {self.records} records skipped ({reasons}): {'; '.join(what)}. "
            f"Fix: {skip_fix(self.skipped)}, or accept the loss with --max-skipped-share 1 "
            f"(the {self.written} written records in {self.out_dir} are a valid dataset)"
        )

    def _media_store_line(self) -> list[str]:
        """``--media-store dedup``'s line: how many distinct files hold how many uses, in how many bytes."""
        if self.media_store != "dedup" or not (self.images or self.videos):
            return []
        uses, inline = self.images + self.videos, self.image_bytes + self.video_bytes
        return [
            f"  dedup    {self.media_stored} media file(s) stored once for {uses} reference(s) "
            f"({_mb(self.media_stored_bytes)} instead of {_mb(inline)})"
        ]

    def _shard_names(self) -> str:
        first, last = SHARD_NAME % 0, SHARD_NAME % max(0, self.shards - 1)
        return first if self.shards <= 1 else f"{first} .. {last}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
