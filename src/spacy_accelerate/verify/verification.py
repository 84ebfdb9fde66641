"""What an exported model is checked on before it is served, and on every verified hit.

Random piece ids alone miss what every real span holds: its begin and end markers
(``<s>``/``</s>``, ``[CLS]``/``[SEP]``), the unknown piece, and the pieces of real words. A
model whose only fault sits in those embedding rows (a conversion bug, or an entry tampered
with) would pass a check on random ids while changing the annotations. So the check runs on
three kinds of rows, padded to mixed lengths as spaCy pads them:

- random ids, with padding inside a row (spaCy masks every padding piece, wherever it is);
- the vocabulary's control ids: the tokenizer's own special ids where it declares them,
  and the lowest and highest ids, where vocabularies keep their control pieces;
- the pipeline's own inputs on built-in text (:data:`PROBE_TEXTS`), recorded from its piece
  encoder and span striding (:func:`~spacy_accelerate.planning.recording.record_probe`),
  which puts the real markers and pieces in.

What the check runs on decides whether a model is served, and for int8 which plan, so its
digest is part of the cache key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec

#: How many of the lowest and of the highest ids are checked as control ids.
LOW_CONTROL_IDS = 256
HIGH_CONTROL_IDS = 8

#: Built-in text run through the pipeline's own piece encoder: English sentences, and
#: characters that reach the unknown piece or byte fallbacks of most vocabularies.
PROBE_TEXTS: tuple[str, ...] = (
    "From the AP comes this story: President Bush on Tuesday nominated two individuals to "
    "replace retiring jurists on federal courts in the Washington area.",
    "I hope that the US army got an enormous amount of information from her relatives.",
    "Naïve café owners in Zürich sold 3,500 crêpes for €12.50 — “quite a deal” 😀 ꙮ 𝔘𝔫𝔦 "
    "שלום مرحبا 東京 supercalifragilisticexpialidociouslyunpronounceable",
)


def random_rows(spec: EncoderSpec, window: int, *, seed: int = 0) -> EncoderInputs:
    """Random piece ids, padded with the encoder's own ``padding_idx``, rows of mixed lengths,
    one with padding inside."""
    longest = _longest(spec, window)
    lengths = sorted({longest, max(1, (2 * longest) // 3), min(longest, 5), 1}, reverse=True)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), longest), spec.padding_idx, dtype=torch.long)
    for row, length in enumerate(lengths):
        pieces = torch.randint(0, spec.vocab_size - 1, (length,), generator=generator)
        # Shift ids at or above padding_idx up by one so no real piece is padding.
        ids[row, :length] = pieces + (pieces >= spec.padding_idx).long()
    # spaCy masks every padding_idx piece, wherever it stands (a piece encoder
    # may emit it from text); a graph that assumes trailing padding must fail here.
    if longest >= 4:
        ids[0, longest // 2 : longest // 2 + 2] = spec.padding_idx
    return EncoderInputs.from_ids(ids.numpy(), spec.padding_idx)


def _longest(spec: EncoderSpec, window: int) -> int:
    return max(1, min(window, spec.model_max_length, spec.longest_input))


def control_rows(spec: EncoderSpec, window: int, declared: Sequence[int]) -> EncoderInputs:
    """Every control id (see the module's docstring) once, in rows of the window's length;
    the last row shorter, so these rows are padded too."""
    low = range(min(LOW_CONTROL_IDS, spec.vocab_size))
    high = range(max(0, spec.vocab_size - HIGH_CONTROL_IDS), spec.vocab_size)
    wanted = {*low, *high, *(i for i in declared if 0 <= i < spec.vocab_size)}
    ids = sorted(wanted - {spec.padding_idx})
    longest = _longest(spec, window)
    rows = [ids[start : start + longest] for start in range(0, len(ids), longest)] or [[]]
    batch = np.full((len(rows), longest), spec.padding_idx, dtype=np.int64)
    for row, pieces in enumerate(rows):
        batch[row, : len(pieces)] = pieces
    return EncoderInputs.from_ids(batch, spec.padding_idx)


@dataclass(frozen=True)
class Verification:
    """The rows an exported model is checked on (see the module's docstring)."""

    window: int
    #: The tokenizer's declared special ids.
    special_ids: tuple[int, ...] = ()
    #: The pipeline's own inputs on :data:`PROBE_TEXTS`, as its transformer received them.
    probe: tuple[EncoderInputs, ...] = ()

    def batches(self, spec: EncoderSpec) -> list[EncoderInputs]:
        return [
            random_rows(spec, self.window),
            control_rows(spec, self.window, self.special_ids),
            *self.probe,
        ]

    def digest(self, spec: EncoderSpec) -> str:
        """SHA256 of every row checked: part of the cache key."""
        digest = hashlib.sha256()
        for batch in self.batches(spec):
            for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids):
                digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
                digest.update(repr(array.shape).encode())
        return digest.hexdigest()
