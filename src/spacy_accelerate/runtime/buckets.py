"""Shape buckets: the few (batch, sequence) shapes a GPU session ever runs at.

spaCy hands the transformer batches of any size and length. A GPU runtime
wants few distinct shapes: TensorRT builds its engine for a profile range
once, a CUDA graph is captured per shape, and kernels are tuned per shape.
So every batch is padded up to the next batch bucket and its length up to a
multiple of ``sequence_multiple``; a batch larger than the largest bucket
runs in chunks. Padding pieces are masked, so padded rows and columns never
change the real ones; they are cut off again before spaCy sees the output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from spacy_accelerate.architectures.spec import EncoderSpec, check_span_length
from spacy_accelerate.options.gpu import GpuOptions

#: The largest default batch bucket. Spans arrive in batches of up to the
#: pipeline's span batch size (384 by default); beyond 128 spans of 128 pieces
#: a GPU is saturated, and chunking costs less than buffers for 384 rows.
DEFAULT_MAX_BATCH = 128


def default_batch_buckets(span_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to the span batch (at most :data:`DEFAULT_MAX_BATCH`)."""
    largest = max(1, min(span_batch_size, DEFAULT_MAX_BATCH))
    sizes = {2**power for power in range(largest.bit_length()) if 2**power <= largest}
    return tuple(sorted(sizes | {largest}))


@dataclass(frozen=True)
class BucketPlan:
    """The shapes one session runs at.

    ``window`` is the longest piece sequence the pipeline's spans produce:
    shapes up to it are warmed up and (with CUDA graphs) captured. Longer
    inputs, up to the ``longest`` the model's positions allow, still run,
    padded to the same multiple.
    """

    batch_sizes: tuple[int, ...]
    sequence_multiple: int
    window: int
    longest: int

    @classmethod
    def for_pipeline(cls, options: GpuOptions, spec: EncoderSpec, window: int, span_batch: int):
        longest = spec.longest_input
        return cls(
            batch_sizes=options.batch_buckets or default_batch_buckets(span_batch),
            sequence_multiple=options.sequence_multiple,
            window=max(1, min(window, longest)),
            longest=longest,
        )

    @property
    def largest_batch(self) -> int:
        return self.batch_sizes[-1]

    def batch_for(self, rows: int) -> int:
        """The smallest batch bucket that holds ``rows`` (at most the largest bucket)."""
        for size in self.batch_sizes:
            if size >= rows:
                return size
        raise ValueError(f"{rows} rows exceed the largest bucket; split them with chunks()")

    def sequence_for(self, length: int) -> int:
        """``length`` rounded up to the multiple, never past what the model accepts."""
        check_span_length(length, self.longest)
        multiple = self.sequence_multiple
        return min(max(1, math.ceil(length / multiple)) * multiple, self.longest)

    def shape_for(self, rows: int, length: int) -> tuple[int, int]:
        return self.batch_for(rows), self.sequence_for(length)

    def chunks(self, rows: int) -> Iterator[slice]:
        """Row ranges of at most the largest bucket each."""
        for start in range(0, rows, self.largest_batch):
            yield slice(start, min(rows, start + self.largest_batch))

    @property
    def sequence_sizes(self) -> tuple[int, ...]:
        """The sequence buckets up to the window: the lengths spaCy's spans produce."""
        top = self.sequence_for(self.window)
        sizes = range(self.sequence_multiple, top + self.sequence_multiple, self.sequence_multiple)
        return tuple(sorted({min(size, top) for size in sizes}))

    def warm_shapes(self) -> list[tuple[int, int]]:
        """Every bucket shape of the window range, smallest first."""
        return [(b, s) for b in self.batch_sizes for s in self.sequence_sizes]

    def in_window(self, shape: tuple[int, int]) -> bool:
        return shape[1] <= self.sequence_for(self.window)

    @property
    def arena_shape(self) -> tuple[int, int]:
        """The largest warm shape: device buffers are sized for it once."""
        return self.largest_batch, self.sequence_for(self.window)

    def profile_shapes(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """TensorRT's (min, opt, max): one profile spanning every bucket, tuned for full
        batches of the window's length, so no new shape ever rebuilds the engine."""
        return (
            (self.batch_sizes[0], self.sequence_for(1)),
            self.arena_shape,
            (self.largest_batch, self.sequence_for(self.longest)),
        )


def pad_into(buffer: torch.Tensor, source: torch.Tensor, fill: int) -> None:
    """Write ``source`` into the top-left corner of ``buffer``; ``fill`` everywhere else."""
    rows, length = source.shape
    buffer.fill_(fill)
    buffer[:rows, :length].copy_(source)


def unpad(output: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """The real rows (and pieces) of a bucket's output, as a tensor of its own.

    A copy, not a view: the bucket's buffer is overwritten by the next batch,
    while spaCy keeps the output on its documents.
    """
    kept = output[:rows, :length] if output.dim() == 3 else output[:rows]
    return kept.clone()
