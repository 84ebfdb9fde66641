"""The pipeline annotating texts in one pass: spaCy's own ``Language.pipe`` (never the
overlapped one), the texts in order of length or as given, said as a progress step.

The calibration's PyTorch fp32 reference (:mod:`.recording`), the agreement gate and
bf16's autocast floor (:mod:`.judging`) and ``precision="auto"``'s timing runs
(:mod:`.auto_precision`) all annotate this way.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from contextlib import ExitStack, closing

from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate import progress


def annotate(
    nlp: Language, texts: Sequence[str], what: str | None = None, *, shortest_first: bool = True
) -> list[Doc]:
    """``nlp``'s documents for ``texts``, in their order, as the autocast reference and the
    timing run it (see :func:`annotated`)."""
    by_index = dict(annotated(nlp, texts, what, shortest_first=shortest_first))
    return [by_index[index] for index in range(len(texts))]


def annotated(
    nlp: Language, texts: Sequence[str], what: str | None = None, *, shortest_first: bool = True
) -> Generator[tuple[int, Doc], None, None]:
    """``nlp``'s document of each of ``texts`` with the text's index, as each is done; said
    as the progress step ``what`` where given (not where it is timed).

    With ``shortest_first`` the texts go through the pipeline in order of length: spaCy
    pads every span of a batch to its longest one and PyTorch runs the padding, so texts
    of like length batched together cost less (measured in ``docs/performance.md``).
    Which texts share a batch changes annotations only through float rounding (the
    attention mask keeps padding out). The calibration's own pass keeps the texts' order
    (:func:`~spacy_accelerate.planning.recording.record_calls`): its batches are the items
    int8 is quantized on."""
    order = list(range(len(texts)))
    if shortest_first:
        order.sort(key=lambda index: len(texts[index]))
    # spaCy's own pipe, never the overlapped one (.pipe): the module judged is scoped to
    # this thread, and a helper thread would run the one served instead.
    stream: Iterator[Doc] = Language.pipe(nlp, (texts[index] for index in order), batch_size=32)
    with ExitStack() as stack:  # a pass stopped early still closes its progress step
        if what is not None:
            stream = stack.enter_context(closing(progress.track(stream, what, len(texts))))
        yield from zip(order, stream, strict=True)
