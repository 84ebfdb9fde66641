"""``spacy-accelerate`` / ``python -m spacy_accelerate``: the operator's command line.

Every command reports a failure as one line on stderr and a non-zero exit
status: operators script these commands (container builds, health checks),
and a traceback is neither readable there nor actionable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # spaCy is imported lazily: `--help` and `doctor` stay fast
    from spacy.language import Language

os.environ.setdefault("HF_HUB_OFFLINE", "1")

app = typer.Typer(
    name="spacy-accelerate",
    help="Run spaCy transformer pipelines on ONNX Runtime: same annotations, more documents/s.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
cache_app = typer.Typer(help="Inspect and manage the model cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Model cache (default: $SPACY_ACCELERATE_CACHE or ~/.cache)."),
]
Provider = Annotated[str, typer.Option(help="auto, cpu, cuda, tensorrt or openvino.")]
Precision = Annotated[
    str,
    typer.Option(help="fp32, fp16, bf16, int8, or auto (the fastest plan that passes the gate)."),
]


class CommandError(Exception):
    """A failure to report as one line."""


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn the failures a user can cause or fix into ``Error: ...`` and exit status 1."""
    from spacy_accelerate.errors import SpacyAccelerateError

    try:
        yield
    except (CommandError, SpacyAccelerateError, OSError, ValueError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        typer.echo(f"Error: {message}", err=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        raise typer.Exit(code=130) from None


def _cache_folder(cache_dir: Path | None) -> Path | None:
    if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
        raise CommandError(f"--cache-dir {cache_dir} is a file; give a folder (it may not exist).")
    return cache_dir


def _load_pipeline(path: Path) -> Language:
    import spacy

    if not path.exists():
        raise CommandError(
            f"No pipeline at {path}: give the folder that nlp.to_disk() wrote (it holds "
            "config.cfg)."
        )
    if path.is_dir() and not (path / "config.cfg").is_file():
        raise CommandError(f"{path} is not a spaCy pipeline folder: it has no config.cfg.")
    if path.is_file():
        raise CommandError(f"{path} is a file; give the pipeline's folder (with config.cfg).")
    return spacy.load(path)


@app.command()
def doctor(cache_dir: CacheDir = None) -> None:
    """Versions, providers (and what to install for a missing one), GPU, cache."""
    from spacy_accelerate.cli.doctor import diagnose

    with one_line_errors():
        found = diagnose(_cache_folder(cache_dir))
    typer.echo("versions:")
    for name, version in found.versions.items():
        typer.echo(f"  {name:28s} {version or 'not installed'}")
    typer.echo("providers:")
    for status in found.providers:
        mark = "yes" if status.available else "no "
        typer.echo(f"  {status.provider.value:9s} {mark}  {status.detail}")
    runtimes = ", ".join(found.onnxruntime_providers) or "onnxruntime not installed"
    typer.echo(f"  (ONNX Runtime execution providers: {runtimes})")
    typer.echo(f"cpu: {found.cpu}")
    typer.echo(f"gpu: {found.gpu}")
    typer.echo(
        f"cache: {found.cache_dir} ({found.cache_entries} models, "
        f"{found.cache_bytes / 2**20:.1f} MiB)"
    )


def _bounds(given: str | None) -> float | dict[str, float] | None:
    """``--min-agreement`` as ``optimize()`` takes it: ``0.99`` or ``dep=0.97,tag=0.995``."""
    if given is None:
        return None
    try:
        if "=" not in given:
            return float(given)
        pairs = (part.split("=", 1) for part in given.split(",") if part.strip())
        return {name.strip(): float(value) for name, value in pairs}
    except ValueError:
        raise CommandError(
            f"--min-agreement {given!r} is neither a number (0.99) nor annotation=number pairs "
            "separated by commas (dep=0.97,tag=0.995)."
        ) from None


def _read_lines(texts_file: Path) -> list[str]:
    """The non-empty lines of a UTF-8 texts file, one document each."""
    if not texts_file.is_file():
        raise CommandError(f"No texts file at {texts_file}: give a UTF-8 file, one text a line.")
    texts = [line.strip() for line in texts_file.read_text(encoding="utf8").splitlines()]
    texts = [text for text in texts if text]
    if not texts:
        raise CommandError(f"{texts_file} has no text: write one document per line.")
    return texts


@app.command()
def optimize(
    pipeline_path: Annotated[Path, typer.Argument(help="A pipeline folder (nlp.to_disk).")],
    provider: Provider = "auto",
    precision: Precision = "fp32",
    cache_dir: CacheDir = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Also save the optimized pipeline here (it loads accelerated)."),
    ] = None,
    warmup: Annotated[bool, typer.Option(help="Run the batch shapes once before serving.")] = True,
    verify: Annotated[
        bool, typer.Option(help="Check a cached model against PyTorch again when it loads.")
    ] = True,
    tolerance: Annotated[
        float | None, typer.Option(help="fp32: largest absolute difference to PyTorch.")
    ] = None,
    min_cosine: Annotated[
        float | None, typer.Option(help="fp16, bf16, int8: least token cosine to PyTorch.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="CPU threads (default: this process's CPUs).")
    ] = None,
    device_id: Annotated[
        int | None, typer.Option(min=0, help="CUDA device (cuda, tensorrt).")
    ] = None,
    fallback: Annotated[
        bool, typer.Option(help="Fall back TensorRT -> CUDA -> CPU instead of failing.")
    ] = False,
    calibration_file: Annotated[
        Path | None,
        typer.Option(
            help="int8, bf16, fp16, auto: UTF-8 texts like yours, one per line, to judge on."
        ),
    ] = None,
    min_agreement: Annotated[
        str | None,
        typer.Option(
            help="int8, bf16, fp16, auto: least share of units whose annotations must stay as "
            "PyTorch's: one number (0.99) or per annotation (dep=0.97,tag=0.995)."
        ),
    ] = None,
    lock_timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Seconds to wait for another process building the model."),
    ] = None,
    missing_cache: Annotated[
        str,
        typer.Option(
            help="What --output's pipeline does where its model is not cached: rebuild or pytorch."
        ),
    ] = "rebuild",
) -> None:
    """Build the pipeline's cache entries ahead of time (e.g. in a container image)."""
    from spacy_accelerate import api as accelerate

    with one_line_errors():
        nlp = _load_pipeline(pipeline_path)
        accelerate.optimize(
            nlp,
            provider,
            precision,
            cache_dir=_cache_folder(cache_dir),
            warmup=warmup,
            verify=verify,
            tolerance=tolerance,
            min_cosine=min_cosine,
            threads=threads,
            device_id=device_id,
            fallback=fallback,
            calibration_texts=_read_lines(calibration_file) if calibration_file else None,
            min_agreement=_bounds(min_agreement),
            lock_timeout=lock_timeout,
            missing_cache=missing_cache,
        )
        for name, proxy in accelerate.accelerated_components(nlp).items():
            typer.echo(
                f"{name}: served by {proxy.session.provider.provider.value} "
                f"{proxy.session.config.precision.value}"
            )
            exported, parity = proxy.exported, proxy.exported.parity
            source = "cache hit" if exported.cache_hit else "exported"
            checked = (
                f"max abs diff {parity.worst:.2e}, min token cosine {parity.worst_cosine:.5f}"
                + (f", mean {parity.worst_mean_cosine:.5f}" if parity.mean_cosine else "")
                + (f", plan: {parity.plan}" if parity.plan else "")
                if parity
                else "not re-checked"
            )
            typer.echo(f"{name}: {source}, key {exported.key[:16]}, {checked}")
            if exported.compiled_as:
                typer.echo(f"  compiled as {exported.compiled_as}")
            if exported.agreement is not None:
                typer.echo(f"  agreement on the calibration texts: {exported.agreement.describe()}")
            typer.echo(f"  {exported.path}")
        if output is not None:
            nlp.to_disk(output)
            typer.echo(f"saved the optimized pipeline to {output}")


@app.command()
def bench(
    pipeline_path: Annotated[Path, typer.Argument(help="A pipeline folder (nlp.to_disk).")],
    texts_file: Annotated[
        Path | None,
        typer.Argument(help="UTF-8 text, one document per line (or give --gold instead)."),
    ] = None,
    provider: Provider = "cpu",
    precision: Annotated[
        list[str], typer.Option(help="Precision(s) to compare with PyTorch; repeat the option.")
    ] = ["fp32"],  # noqa: B006 - typer reads the default, never mutates it
    batch_size: int = 64,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    output: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    gold: Annotated[
        Path | None,
        typer.Option(
            help="Gold annotations (.conllu or .spacy): bench their texts and score every "
            "variant against them. Replaces TEXTS_FILE."
        ),
    ] = None,
) -> None:
    """Your pipeline on your texts: PyTorch vs accelerated, side by side, with agreement
    (and accuracy against gold with --gold)."""
    from spacy_accelerate.bench.gold import gold_texts, read_gold, score
    from spacy_accelerate.bench.side_by_side import side_by_side, write_report
    from spacy_accelerate.verify.agreement import compare

    with one_line_errors():
        if texts_file is not None and gold is not None:
            raise CommandError(
                "Give TEXTS_FILE or --gold, not both: with --gold, the gold documents' texts "
                "are benchmarked."
            )
        if texts_file is None and gold is None:
            raise CommandError(
                "Give TEXTS_FILE (UTF-8, one text a line) or --gold FILE (.conllu or .spacy)."
            )
        texts = _read_lines(texts_file) if texts_file is not None else []
        nlp = _load_pipeline(pipeline_path)
        gold_docs = read_gold(gold, nlp.vocab) if gold is not None else []
        if gold_docs:
            texts = gold_texts(gold_docs)
        variants = {p: {"provider": provider, "precision": p} for p in precision}
        result = side_by_side(nlp, texts, variants, batch_size=batch_size, repeats=repeats)
        scores: dict[str, dict[str, float | None]] = {}
        if gold_docs:
            scores["pytorch"] = score(result.reference, gold_docs)
            for name, variant in result.variants.items():
                scores[name] = score(variant.docs, gold_docs)

    def against_gold(name: str) -> str:
        if name not in scores:
            return ""
        found = ", ".join(
            f"{key} {'n/a' if value is None else f'{value:.2%}'}"
            for key, value in scores[name].items()
        )
        return f"  gold: {found or 'no annotation to score'}"

    typer.echo(f"{len(texts)} texts, {result.words:,} words, batch {batch_size}, {repeats} passes")
    typer.echo(
        f"  {'PyTorch fp32':22s} {result.pytorch_wps:9,.0f} words/s{against_gold('pytorch')}"
    )
    for name, variant in result.variants.items():
        rates = compare(result.reference, variant.docs).describe()  # as the gate judges
        typer.echo(
            f"  {provider + ' ' + name:22s} {result.wps(name):9,.0f} words/s "
            f"{result.speedup(name):.2f}x  agreement: {rates}{against_gold(name)}"
        )
    if output is not None:
        report = result.as_dict()
        if scores:
            report["gold"] = {"file": str(gold), "documents": len(gold_docs)}
            report["pytorch"]["gold"] = scores["pytorch"]
            for name in result.variants:
                report["variants"][name]["gold"] = scores[name]
        write_report(report, output)


@cache_app.command("list")
def cache_list(cache_dir: CacheDir = None) -> None:
    """The cached models: key, family, provider, precision, size, creation time; for a
    lossy plan, the plan and its agreement per annotation on the calibration texts."""
    from spacy_accelerate.cache.listing import list_cached

    with one_line_errors():
        entries = list_cached(_cache_folder(cache_dir))
    if not entries:
        typer.echo("no cached models")
    for entry in entries:
        typer.echo(
            f"{entry.key[:16]}  {entry.family or '?':12s} {entry.provider or '?':9s} "
            f"{entry.precision or '?':5s} {entry.size_bytes / 2**20:8.1f} MiB  {entry.created}"
        )
        if entry.note:
            typer.echo(f"  {entry.note}")
        if entry.plan:
            typer.echo(f"  plan: {entry.plan}")
        if entry.agreement:
            rates = ", ".join(f"{name} {rate:.2%}" for name, rate in entry.agreement.items())
            typer.echo(f"  agreement with PyTorch fp32 on the calibration texts: {rates}")


@cache_app.command("size")
def cache_size_command(cache_dir: CacheDir = None) -> None:
    """Disk used by the cache."""
    from spacy_accelerate.cache.listing import cache_size
    from spacy_accelerate.cache.store import default_cache_dir

    with one_line_errors():
        size = cache_size(_cache_folder(cache_dir))
    typer.echo(f"{size / 2**20:.1f} MiB in {cache_dir or default_cache_dir()}")


@cache_app.command("clear")
def cache_clear(
    cache_dir: CacheDir = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every cached model (they are rebuilt on the next optimize())."""
    from spacy_accelerate.cache.listing import clear_cache

    with one_line_errors():
        folder = _cache_folder(cache_dir)
        if not yes and not typer.confirm(f"Remove every cached model in {folder or 'the cache'}?"):
            raise typer.Exit(code=1)
        removed = clear_cache(folder)
    typer.echo(f"removed {removed} cached models")


def main() -> None:
    app()
