"""A text task encoder for Energon-prepared GPT-SFT JSONL, packed by the same carry-over wrapper.

``energon prepare data.jsonl`` (or Energon's Python API) indexes the file; then
``get_train_dataset("data.jsonl", ..., task_encoder=TextPackingTaskEncoder(...),
packing_buffer_size=K)`` streams fixed-width THD packs. Records are prompt/completion or chat
(see :mod:`energon_pack.sft.formats`); tokens are computed once, in pre-encode, and the buffer
holds int32 ids and a bool mask per sample.

Energon's default JSONL loader parses each line before any encoder runs and drops a broken
line with only a log line; this encoder keeps lines raw until pre-encode instead, so a broken
line becomes a counted ``invalid_json`` skip like every other bad record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from megatron.energon import (
    Cooker,
    DefaultCrudeJsonlDatasetFactory,
    DefaultTaskEncoder,
    Sample,
    SkipSample,
    basic_sample_keys,
    edataclass,
    stateless,
)
from megatron.energon.flavors.jsonl.crude_jsonl_dataset import CrudeJsonlDatasetFactory

from energon_pack.errors import SampleSkipped
from energon_pack.packing.spec import renamed_knobs
from energon_pack.records import decode_json_record
from energon_pack.thd import ThdSegment, check_text_overlength

from .config import PackingConfig
from .samples import EncodedSegment, PackCandidate, SkippedSample
from .task_encoder import CarryOverPackingMixin


@edataclass
class TextRecordSample(Sample):
    """One stored JSONL record, still raw bytes (parsed in pre-encode)."""

    raw: Any


@stateless
def cook_text_record(crude: dict) -> TextRecordSample:
    return TextRecordSample(**basic_sample_keys(crude), raw=crude.get("json"))


class _RawJsonlFactory(DefaultCrudeJsonlDatasetFactory):
    """Energon's JSONL factory without its eager ``json.loads`` (parsing moves to pre-encode)."""

    def _load_sample(self, sample):
        sample["__subflavors__"] = self.subflavors
        return CrudeJsonlDatasetFactory._load_sample(self, sample)


class TextPackingTaskEncoder(CarryOverPackingMixin, DefaultTaskEncoder):
    """GPT-SFT JSONL (prompt/completion or chat) -> fixed-width THD packs.

    Every argument is keyword-only; a wrong value raises ``ConfigError`` naming the knob and the fix.

    Args:
        tokenizer: what turns text into token ids (and so decides every token count, pack and skip): a
            Hugging Face tokenizer, a Qwen-VL name (``"qwen2-vl"``, ``"qwen2.5-vl"``, ``"qwen3-vl"``: that
            model's real tokenizer, loaded offline) or ``"demo"`` (the small shipped demo tokenizer,
            silently). Default None: there is no model to take a tokenizer from, so None means the demo
            tokenizer with a loud ``DemoTokenizerWarning`` rather than a silent default.
        format: the record format: ``"prompt_completion"`` (``prompt`` / ``completion`` fields, loss on the
            completion, EOS appended; alpaca records with ``prompt_field="instruction", completion_field="output"``;
            a KTO ``label`` / ``kto_tag`` false, 0 or "false" is a ``kto_undesirable`` skip) or ``"chat"``
            (``messages`` / ``conversations`` / ``conversation``, alpaca or TRL prompt/completion records rendered
            as ChatML, loss on the assistant turns). Default ``"prompt_completion"``:
            the plainest GPT-SFT record, which needs no chat template.
        config: the packing knobs (width, alignment, budgets, packer knobs, skip policy; see
            :class:`PackingConfig`). Default None: ``PackingConfig()`` (width 8192, no alignment, carry
            mode, over-long records skipped), with the :class:`PackingConfig` fields in ``kw`` applied on top.
            ``overlength="truncate"`` keeps a record's first ``seq_length`` tokens (a record with nothing
            supervised left is a ``no_trained_tokens`` skip).
        **kw: :class:`PackingConfig` fields given directly (``seq_length=4096, cp=2, ...``; old names such as
            ``width`` / ``pad_multiple`` through the spec's table, one DeprecationWarning), and the knobs of
            ``format``, passed to :func:`energon_pack.sft.formats.make_format`: for ``"prompt_completion"``
            ``prompt_field`` (``"prompt"``), ``completion_field`` (``"completion"``), ``template``
            (``"{prompt}"``), ``separator`` (``""``), ``loss`` (``"completion"`` or ``"full"``),
            ``add_bos`` (False), ``add_eos`` (True), ``strip_whitespace`` (True), ``bos_id`` / ``eos_id``
            (None: the tokenizer's); for ``"chat"`` ``loss_policy`` (``"assistant"``, ``"last_turn"``,
            ``"all"``), ``system_prompt`` (None: none inserted) and ``train_newline_after_im_end`` (False).
            An unknown name is a ConfigError.
    """

    cookers = [Cooker(cook_text_record)]
    decoder = None

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        format: str = "prompt_completion",
        config: PackingConfig | None = None,
        **kw: Any,
    ) -> None:
        from energon_pack.chat.tokenizer import resolve_tokenizer
        from energon_pack.sft.formats import make_format

        super().__init__()
        # old knob names (width=, pad_multiple= ...) first: one warning at the user's line, then picked by new name
        kw = renamed_knobs(type(self).__name__, kw, stacklevel=2)
        packing_kw = {k: kw.pop(k) for k in list(kw) if k in PackingConfig.__dataclass_fields__}
        # no silent default: tokenizer="demo" asks for the demo tokenizer, None warns (DemoTokenizerWarning)
        self.format = make_format(format, resolve_tokenizer(tokenizer, where=type(self).__name__), **kw)
        packing = PackingConfig.build(config, **packing_kw)
        check_text_overlength(packing.overlength, type(self).__name__)
        self.configure_packing(packing, self.format.tokenizer.pad_id)
        if format == "chat" and self.packing.overlength != "truncate":
            shortest = len(
                self.format.encode(
                    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]}
                )
            )
            self.check_width_fits(shortest, "a one-token answer to an empty question (the ChatML headers)")

    def _load_dataset(self, dataset, worker_rotation_offset, worker_config):
        if type(dataset.dataset) is DefaultCrudeJsonlDatasetFactory:
            dataset.dataset.__class__ = _RawJsonlFactory
        return super()._load_dataset(dataset, worker_rotation_offset, worker_config)

    @stateless
    def preencode_sample(self, sample: TextRecordSample) -> PackCandidate | SkippedSample:
        try:
            encoded = self.format.encode(decode_json_record(sample.raw))
        except SampleSkipped as skip:
            return SkippedSample.derive_from(sample, reason=skip.reason, detail=skip.detail)
        ids, mask = encoded.input_ids, encoded.target_mask
        width = self.packing.seq_length
        if len(ids) > width and self.packing.overlength == "truncate":
            ids, mask = ids[:width], mask[:width]
            if not mask[1:].any():
                return SkippedSample.derive_from(
                    sample, reason="no_trained_tokens", detail="nothing supervised after truncation"
                )
        payload = (np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool))
        return PackCandidate.derive_from(
            sample, cost=self.packing.cost(self.layout.segment_span(len(ids))), payload=payload
        )

    @stateless
    def postencode_sample(self, sample: PackCandidate) -> EncodedSegment:
        if isinstance(sample, SkippedSample):  # only without packing: Energon skips it
            raise SkipSample()
        ids, mask = sample.payload
        segment = ThdSegment.from_target_mask(
            torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask), key=sample.__key__
        )
        return EncodedSegment.derive_from(sample, segment=segment)
