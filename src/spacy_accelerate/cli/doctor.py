"""``spacy-accelerate doctor``: versions, providers, CPU, GPU and cache, as text or JSON.

The report is gathered by :mod:`spacy_accelerate.cli.diagnosis`, imported when the
command runs: it loads torch and the runtimes to ask them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from spacy_accelerate.cli._util import CacheDir, Json, app, cache_folder, one_line_errors

if TYPE_CHECKING:
    from spacy_accelerate.cli.diagnosis import Diagnosis


@app.command()
def doctor(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """Versions, providers (and what to install for a missing one), GPU, cache."""
    from spacy_accelerate.cli.diagnosis import diagnose

    with one_line_errors():
        found = diagnose(cache_folder(cache_dir))
    if as_json:
        typer.echo(json.dumps(found.as_dict(), indent=2))
    else:
        _echo(found)


def _echo(found: Diagnosis) -> None:
    typer.echo("versions:")
    for name, version in found.versions.items():
        typer.echo(f"  {name:28s} {version or 'not installed'}")
    typer.echo("providers:")
    for status in found.providers:
        mark = "yes" if status.available else "no "
        typer.echo(f"  {status.provider.value:9s} {mark}  {status.detail}")
    typer.echo("runtimes:")
    for runtime in found.runtimes:
        typer.echo(f"  {runtime}")
    typer.echo(f"cpu: {found.cpu}")
    typer.echo(f"gpu: {found.gpu}")
    typer.echo(
        f"cache: {found.cache_dir} ({found.cache_entries} models, "
        f"{found.cache_bytes / 2**20:.1f} MiB)"
    )
