"""``spacy-accelerate optimize``: build a pipeline's served models ahead of time (in a
container image, say), report what serves each transformer and how it was checked, and
save the optimized pipeline with ``--output``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from spacy_accelerate.cli._util import (
    CacheDir,
    CalibrationFile,
    Code,
    MinAgreement,
    PipelineArg,
    PrecisionOption,
    ProviderOption,
    Quiet,
    Verbose,
    agreement_bounds,
    app,
    cache_folder,
    load_pipeline,
    one_line_errors,
    read_lines,
    speaking,
)
from spacy_accelerate.cli.outputs import check_pipeline_folder
from spacy_accelerate.options.config import DEFAULT_OVERLAP

# The options only this command takes, named as optimize()'s keyword arguments.
Output = Annotated[
    Path | None, typer.Option(help="Also save the optimized pipeline here (it loads accelerated).")
]
Warmup = Annotated[bool, typer.Option(help="Run the batch shapes once before serving.")]
Verify = Annotated[
    bool, typer.Option(help="Check a cached model against PyTorch again when it loads.")
]
Tolerance = Annotated[
    float | None, typer.Option(help="fp32: largest absolute difference to PyTorch.")
]
MinCosine = Annotated[
    float | None, typer.Option(help="fp16, bf16, int8: least token cosine to PyTorch.")
]
Threads = Annotated[
    int | None, typer.Option(min=1, help="CPU threads (default: this process's CPUs).")
]
DeviceId = Annotated[
    int | None, typer.Option(min=0, help="CUDA device, for the providers on an NVIDIA GPU.")
]
Fallback = Annotated[
    bool,
    typer.Option(
        help="Where the provider cannot run here, serve on the next of its fallback chain "
        "(towards the CPU) instead of failing."
    ),
]
LockTimeout = Annotated[
    float | None,
    typer.Option(min=0, help="Seconds to wait for another process building the model."),
]
MissingCache = Annotated[
    str,
    typer.Option(
        help="What --output's pipeline does where its model is not cached: rebuild or pytorch."
    ),
]
Bundle = Annotated[
    bool,
    typer.Option(
        help="Save the verified models with --output's pipeline (--no-bundle: only the "
        "options, and each machine builds from the weights or its cache)."
    ),
]
Overlap = Annotated[
    bool | None,
    typer.Option(
        help="--output's pipeline runs the transformer while spaCy's components annotate "
        "the batch before (--no-overlap: one after the other; neither: where it measures "
        "a gain here).",
        show_default=False,
    ),
]

WorkloadOption = Annotated[
    str,
    typer.Option(
        help="What the pipeline serves: batches (nlp.pipe) or documents (nlp(text), one per "
        "call, as a web service does); --precision auto times its candidates on it.",
    ),
]


@app.command()
def optimize(
    pipeline: PipelineArg,
    provider: ProviderOption = "auto",
    precision: PrecisionOption = "fp32",
    cache_dir: CacheDir = None,
    output: Output = None,
    warmup: Warmup = True,
    verify: Verify = True,
    tolerance: Tolerance = None,
    min_cosine: MinCosine = None,
    threads: Threads = None,
    device_id: DeviceId = None,
    fallback: Fallback = False,
    calibration_file: CalibrationFile = None,
    min_agreement: MinAgreement = None,
    lock_timeout: LockTimeout = None,
    missing_cache: MissingCache = "rebuild",
    bundle: Bundle = True,
    overlap: Overlap = DEFAULT_OVERLAP,
    workload: WorkloadOption = "batches",
    code: Code = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Build the pipeline's cache entries ahead of time (e.g. in a container image)."""
    with one_line_errors(), speaking(quiet, verbose):
        if output is not None:
            check_pipeline_folder(output, "--output")
        nlp = load_pipeline(pipeline, code)  # first, before anything heavy (hub_offline)
        from spacy_accelerate import api as accelerate

        accelerate.optimize(
            nlp,
            provider,
            precision,
            cache_dir=cache_folder(cache_dir),
            warmup=warmup,
            verify=verify,
            tolerance=tolerance,
            min_cosine=min_cosine,
            threads=threads,
            device_id=device_id,
            fallback=fallback,
            calibration_texts=read_lines(calibration_file) if calibration_file else None,
            min_agreement=agreement_bounds(min_agreement),
            lock_timeout=lock_timeout,
            missing_cache=missing_cache,
            bundle=bundle,
            overlap=overlap,
            workload=workload,
        )
        for name, proxy in accelerate.accelerated_components(nlp).items():
            _echo_served(name, proxy.exported)
        if output is not None:
            nlp.to_disk(output)
            typer.echo(f"saved the optimized pipeline to {output}")


def _echo_served(name: str, exported: Any) -> None:
    """What serves component ``name`` (``optimize()``'s INFO line too), and its checks."""
    parity = exported.parity
    typer.echo(f"{name}: served by {exported.summary}")
    checked = (
        f"max abs diff {parity.worst:.2e}, min token cosine {parity.worst_cosine:.5f}"
        + (f", mean {parity.worst_mean_cosine:.5f}" if parity.mean_cosine else "")
        if parity
        else "not re-checked"
    )
    typer.echo(f"  against PyTorch: {checked}")
    if exported.auto_choice:
        typer.echo(f"  {exported.auto_choice}")
    if exported.record.compiled_as:
        typer.echo(f"  compiled as {exported.record.compiled_as}")
    if exported.record.agreement is not None:
        typer.echo(f"  agreement on the calibration texts: {exported.record.agreement.describe()}")
    typer.echo(f"  {exported.path}")
