"""The CPU runtimes run a batch's rows in groups of similar length (``length_groups``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from annotations import disagreements, max_abs_diff, run

import spacy_accelerate
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning.annotating import annotate
from spacy_accelerate.planning.recording import record_calls
from spacy_accelerate.planning.row_groups import call_in_row_groups
from spacy_accelerate.runtime.length_groups import (
    GROUP_COST,
    LENGTH_MULTIPLE,
    plan_groups,
    row_lengths,
    run_by_length,
)
from spacy_accelerate.verify.parity import reference_outputs

WIDTH = 128


def masks_of(lengths: Sequence[int], width: int = WIDTH) -> np.ndarray:
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return mask


def test_a_row_ends_after_its_last_real_piece():
    mask = masks_of([128, 5, 0, 70])
    mask[0, 60:62] = 0  # a masked piece inside a row stays inside
    mask[3, 10] = 0
    assert row_lengths(mask).tolist() == [128, 5, 1, 70]


@pytest.mark.parametrize("seed", range(5))
def test_groups_cover_every_row_once_and_never_cut_a_real_piece(seed: int):
    generator = np.random.default_rng(seed)
    lengths = np.concatenate(
        [np.full(generator.integers(0, 40), WIDTH), generator.integers(1, WIDTH, 60)]
    )
    groups = plan_groups(lengths, WIDTH)
    rows = np.concatenate([group.rows for group in groups])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    for group in groups:
        assert lengths[group.rows].max() <= group.length <= WIDTH
        assert group.length % LENGTH_MULTIPLE == 0 or group.length == WIDTH
    ran = sum(len(group.rows) * group.length + GROUP_COST for group in groups)
    assert ran <= len(lengths) * WIDTH + GROUP_COST  # never worse than one call
    assert len(groups) > 1  # 60 rows of random lengths: grouping pays here


def test_rows_of_one_length_stay_one_call():
    groups = plan_groups(np.full(20, WIDTH), WIDTH)
    assert [(len(g.rows), g.length) for g in groups] == [(20, WIDTH)]


def fake_encoder(calls: list[tuple[int, int]], reuse: np.ndarray | None = None):
    """A position-dependent stand-in: each position's state is the running sum of the real
    ids so far, tagged with its position; the pooled output is the first position's."""

    def encode(feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        calls.append(ids.shape)
        running = np.cumsum(ids * mask, axis=1).astype(np.float32)
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.float32), ids.shape)
        hidden = np.stack([running, positions], axis=-1)
        if reuse is not None:  # like an infer request: one buffer, overwritten per call
            view = reuse[: hidden.size].reshape(hidden.shape)
            view[...] = hidden
            hidden = view
        outputs = {"hidden": hidden, "pooled": hidden[:, 0].copy()}
        return [outputs[name] for name in names]

    return encode


@pytest.mark.parametrize("borrowed", [False, True])
def test_grouped_outputs_equal_one_call_at_every_real_piece(borrowed: bool):
    generator = np.random.default_rng(7)
    lengths = [WIDTH] * 12 + generator.integers(1, WIDTH, 30).tolist()
    mask = masks_of(lengths)
    ids = generator.integers(1, 1000, mask.shape) * mask
    feeds = {"input_ids": ids, "attention_mask": mask}
    whole_calls: list[tuple[int, int]] = []
    hidden, pooled = fake_encoder(whole_calls)(feeds, ["hidden", "pooled"])
    calls: list[tuple[int, int]] = []
    buffer = np.empty(ids.size * 2, dtype=np.float32) if borrowed else None
    encode = fake_encoder(calls, buffer)
    grouped_hidden, grouped_pooled = run_by_length(
        encode, feeds, ["hidden", "pooled"], borrowed=borrowed
    )
    assert len(calls) > 1 and all(shape[1] <= WIDTH for shape in calls)
    assert sum(shape[0] for shape in calls) == len(lengths)
    real = mask.astype(bool)
    np.testing.assert_array_equal(grouped_hidden[real], hidden[real])
    # Past each group's length nothing ran: zeros, where one call computed padding's states.
    assert (grouped_hidden[~real] == 0).all(axis=-1).mean() > 0.5
    np.testing.assert_array_equal(grouped_pooled, pooled)
    assert grouped_hidden.shape == hidden.shape and grouped_pooled.shape == pooled.shape


@pytest.mark.parametrize(
    "lengths",
    [[5], [128, 0, 3], [7, 7, 1], [1] * 40 + [128] * 3],
    ids=["one row", "a row of nothing", "narrow", "mostly short"],
)
@pytest.mark.parametrize("width", [8, WIDTH])
def test_odd_batches_keep_every_real_piece(lengths: list[int], width: int):
    lengths = [min(length, width) for length in lengths]
    mask = masks_of(lengths, width)
    if width > 4:  # a masked piece inside the first row
        mask[0, 2] = 0
    ids = np.arange(1, mask.size + 1).reshape(mask.shape) * mask
    feeds = {"input_ids": ids, "attention_mask": mask}
    hidden, pooled = fake_encoder([])(feeds, ["hidden", "pooled"])
    got_hidden, got_pooled = run_by_length(
        fake_encoder([], np.empty(ids.size * 2, np.float32)),
        feeds,
        ["hidden", "pooled"],
        borrowed=True,
    )
    real = mask.astype(bool)
    np.testing.assert_array_equal(got_hidden[real], hidden[real])
    assert got_hidden.shape == hidden.shape and got_pooled.shape == pooled.shape


@pytest.mark.parametrize("provider", ["cpu", "openvino"])
def test_pipelines_run_grouped_and_keep_pytorchs_results(
    provider: str,
    sample_path: Callable[[str], Path],
    ewt_texts: list[str],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    nlp = spacy.load(sample_path("roberta"))
    texts = ewt_texts[:32]
    expected = run(nlp, texts, batch_size=16)
    spacy_accelerate.optimize(nlp, provider, "fp32", cache_dir=cache_dir)
    runner = spacy_accelerate.accelerated_components(nlp)["transformer"].session.runner
    batches: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []
    whole, grouped = runner.run_whole, runner.run_arrays

    def run_arrays(feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        batches.append((feeds["input_ids"].shape, []))
        return grouped(feeds, names)

    def run_whole(feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        batches[-1][1].append(feeds["input_ids"].shape)
        return whole(feeds, names)

    monkeypatch.setattr(runner, "run_arrays", run_arrays)
    monkeypatch.setattr(runner, "run_whole", run_whole)
    actual = run(nlp, texts, batch_size=16)
    # Some batch ran in several groups, each of its rows once.
    split = [(shape, calls) for shape, calls in batches if len(calls) > 1]
    assert split, batches
    assert all(sum(rows for rows, _ in calls) == shape[0] for shape, calls in split)
    assert max_abs_diff(expected, actual) <= 1e-4
    assert disagreements(expected, actual, nlp) == []


@pytest.mark.parametrize("sample", ["roberta", "st-bert-hidden"])
def test_the_calibration_reference_runs_grouped_and_keeps_pytorchs_results(
    sample: str, sample_path: Callable[[str], Path], ewt_texts: list[str]
):
    """The PyTorch pass that records the calibration runs each batch's rows in groups of
    like length (less padding), records the batches exactly as spaCy made them, and
    annotates as the plain PyTorch pipeline does."""
    nlp = spacy.load(sample_path(sample))
    texts = ewt_texts[:40]
    expected = annotate(nlp, texts, shortest_first=False)
    location = find_shim(transformer_components(nlp)[0])
    spec = detect_architecture(location.read_pytorch_module()).spec
    ran: list[tuple[int, int]] = []
    hook = location.read_pytorch_module().register_forward_pre_hook(
        lambda _module, args, kwargs: ran.append(tuple((args or [kwargs["input_ids"]])[0].shape)),
        with_kwargs=True,
    )
    try:
        calls, docs = record_calls(nlp, location, spec, texts)
    finally:
        hook.remove()
    recorded = [call.shape for call in calls]
    assert sum(rows for rows, _ in ran) == sum(rows for rows, _ in recorded)
    assert sum(r * w for r, w in ran) < sum(r * w for r, w in recorded)  # padding left out
    assert max(width for _, width in recorded) == max(width for _, width in ran)
    assert max_abs_diff(expected, list(docs)) <= 1e-4
    assert disagreements(expected, list(docs), nlp) == []


def test_a_call_whose_output_cannot_be_regrouped_runs_whole(sample_path: Callable[[str], Path]):
    """Attention weights (rows, heads, positions, positions) do not regroup: the batch
    runs in one call, as spaCy made it; so does a model given no attention mask."""
    nlp = spacy.load(sample_path("st-bert"))
    module = find_shim(transformer_components(nlp)[0]).read_pytorch_module().eval()
    mask = torch.from_numpy(masks_of([WIDTH] + [5] * 8))
    ids = torch.where(mask.bool(), 5, 0)
    widths: list[int] = []
    hook = module.register_forward_pre_hook(
        lambda _module, _args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True,
    )
    with torch.no_grad():
        attended = call_in_row_groups(
            module,
            (),
            {"input_ids": ids, "attention_mask": mask, "output_attentions": True},
            mask.numpy(),
        )
        direct = module(input_ids=ids, attention_mask=mask, output_attentions=True)
        call_in_row_groups(module, (), {"input_ids": ids}, mask.numpy())
        call_in_row_groups(module, (), {"input_ids": ids, "attention_mask": mask}, mask.numpy())
    hook.remove()
    # Grouped and regrouped, then whole; the call itself; no mask: whole; grouped.
    assert widths == [16, WIDTH, WIDTH, WIDTH, WIDTH, 16, WIDTH]
    for got, want in zip(attended.attentions, direct.attentions, strict=True):
        torch.testing.assert_close(got, want)


def test_parity_references_run_grouped_and_keep_every_real_piece(
    sample_path: Callable[[str], Path],
):
    """PyTorch's reference states for the parity check run the rows in groups of like
    length, as the served models do: the same at every real piece, less padding run."""
    nlp = spacy.load(sample_path("roberta"))
    module = find_shim(transformer_components(nlp)[0]).read_pytorch_module()
    detected = detect_architecture(module)
    mask = masks_of([WIDTH] + [9] * 8)
    ids = np.where(mask.astype(bool), 7, detected.spec.padding_idx)
    inputs = EncoderInputs(ids, mask, np.zeros_like(ids))
    widths: list[int] = []
    hook = module.register_forward_pre_hook(
        lambda _module, args, _kwargs: widths.append(args[0].shape[1]), with_kwargs=True
    )
    with torch.no_grad():
        grouped = reference_outputs(module, detected, inputs)
        whole = detected.architecture.reference_outputs(module.eval(), inputs, detected.spec)
    hook.remove()
    assert widths == [16, WIDTH, WIDTH]
    real = mask.astype(bool)
    for got, want in zip(grouped, whole, strict=True):
        np.testing.assert_allclose(got[real], want[real], atol=1e-5)
        assert not got[1:, LENGTH_MULTIPLE:].any()  # past the short rows' group: not run
