"""``spacy-accelerate cache list | size | clear``: the model cache, inspected and emptied."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from spacy_accelerate.cli._util import CacheDir, Json, cache_app, cache_folder, one_line_errors

if TYPE_CHECKING:
    from spacy_accelerate.provision.listing import CachedModel


@cache_app.command("list")
def cache_list(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """The cached models, a row each: key, family, provider, precision, size, creation and
    last use; under it the pipeline it was built from, the plan served and, for a lossy
    plan, its agreement per annotation on the calibration texts."""
    from spacy_accelerate.provision.listing import list_cached

    with one_line_errors():
        entries = list_cached(cache_folder(cache_dir))
    if as_json:
        typer.echo(json.dumps([entry.as_dict() for entry in entries], indent=2))
        return
    if not entries:
        typer.echo("no cached models")
        return
    typer.echo(
        f"{'KEY':16s}  {'FAMILY':12s} {'PROVIDER':9s} {'PREC':5s} {'SIZE':>12s}  "
        f"{'CREATED':25s}  LAST USED"
    )
    for entry in entries:
        _echo_entry(entry)


def _echo_entry(entry: CachedModel) -> None:
    """One cached model: its row, then where it came from and what it serves."""
    typer.echo(
        f"{entry.key[:16]}  {entry.family or '?':12s} {entry.provider or '?':9s} "
        f"{entry.precision or '?':5s} {entry.size_bytes / 2**20:8.1f} MiB  "
        f"{entry.created:25s}  {entry.last_used or '?'}"
    )
    source = " ".join(part for part in (entry.source, entry.component) if part)
    typer.echo(f"  from: {source or 'not recorded (built by an earlier release)'}")
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
    from spacy_accelerate.cache.root import default_cache_dir
    from spacy_accelerate.provision.listing import cache_size

    with one_line_errors():
        size = cache_size(cache_folder(cache_dir))
    typer.echo(f"{size / 2**20:.1f} MiB in {cache_dir or default_cache_dir()}")


@cache_app.command("clear")
def cache_clear(
    cache_dir: CacheDir = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every cached model (they are rebuilt on the next optimize())."""
    from spacy_accelerate.cache.root import default_cache_dir
    from spacy_accelerate.provision.listing import clear_cache

    with one_line_errors():
        folder = cache_folder(cache_dir) or default_cache_dir()
        if not yes and not typer.confirm(f"Remove every cached model in {folder}?"):
            raise typer.Exit(code=1)
        removed = clear_cache(folder)
    typer.echo(f"removed {removed} cached models from {folder}")
