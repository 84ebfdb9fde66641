"""One batch of encoder inputs, as spaCy hands it over and as ONNX Runtime takes it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spacy_accelerate.architectures.spec import EncoderSpec


@dataclass(frozen=True)
class EncoderInputs:
    """Piece ids, the mask of real pieces and the token types, all int64 ``(batch, length)``."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    @classmethod
    def from_ids(cls, input_ids: np.ndarray, padding_idx: int) -> EncoderInputs:
        """Inputs as curated transformers see them: every ``padding_idx`` piece is masked."""
        ids = np.asarray(input_ids, dtype=np.int64)
        return cls(ids, (ids != padding_idx).astype(np.int64), np.zeros_like(ids))

    @classmethod
    def uniform(cls, spec: EncoderSpec, rows: int, length: int) -> EncoderInputs:
        """``rows`` x ``length`` of one real (non-padding) piece: shapes for tracing and warm-up."""
        token = (spec.padding_idx + 1) % spec.vocab_size
        return cls.from_ids(np.full((rows, length), token, dtype=np.int64), spec.padding_idx)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    def feeds(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The arrays called ``names``: a graph without token types gets none."""
        arrays = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }
        return {name: arrays[name] for name in names}

    def rows(self) -> Iterator[EncoderInputs]:
        """Each row on its own, cut to its real pieces: what a measurement made on the
        pieces' outputs (int8 statistics, harm) runs without computing the padding. A row
        of padding alone has nothing to measure and is left out."""
        for row in range(self.input_ids.shape[0]):
            real = self.attention_mask[row].astype(bool)
            if not real.any():
                continue
            yield EncoderInputs(
                self.input_ids[row : row + 1, real],
                self.attention_mask[row : row + 1, real],
                self.token_type_ids[row : row + 1, real],
            )

    def as_torch(self, spec: EncoderSpec) -> dict[str, torch.Tensor]:
        """Keyword arguments for a Hugging Face model with the same inputs."""
        feeds = self.feeds(spec.input_names)
        return {name: torch.from_numpy(array) for name, array in feeds.items()}
