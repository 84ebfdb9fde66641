"""A backend is one folder plus one registration (:mod:`fake_backend`): registered in the
provider table, and nowhere else, a throwaway backend is served by ``optimize()``, chosen
by ``auto``, listed by ``doctor`` and taken by the command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import spacy
from annotations import max_abs_diff, run
from fake_backend import FAKE, FakeBackend, registered
from typer.testing import CliRunner

import spacy_accelerate
from spacy_accelerate.backends import registry
from spacy_accelerate.cli import app
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.options.config import Provider
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.options.request import build_config


@pytest.fixture()
def fake() -> Iterator[None]:
    with registered():
        yield


def test_unregistered_it_is_an_unknown_provider():
    with pytest.raises(InvalidOptionError, match="Unknown provider 'fake-cpu'"):
        build_config(FAKE.value, "fp32")


def test_auto_picks_it_where_it_ranks_first(fake, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registry, "torch_cuda_problem", lambda: "no GPU in this test")
    assert registry.check_provider(build_config("auto", "fp32")).provider is FAKE
    # It serves fp32 only: int8 goes to the built-in providers.
    assert registry.check_provider(build_config("auto", "int8")).provider is not FAKE
    # Its fallback is the table's row, walked like a built-in one.
    chain = registry.fallback_chain(build_config(FAKE.value, "fp32", fallback=True))
    assert [step.provider.value for step in chain] == [FAKE.value, "cpu"]


def test_optimize_serves_it_with_pytorchs_results(
    fake, sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str]
):
    nlp = spacy.load(sample_path("bert"))
    reference = run(nlp, ewt_texts[:16], batch_size=8)
    opened = FakeBackend.opened
    spacy_accelerate.optimize(nlp, provider=FAKE.value, cache_dir=cache_dir, overlap=False)
    assert FakeBackend.opened > opened
    served = run(nlp, ewt_texts[:16], batch_size=8)
    assert max_abs_diff(reference, served) < 1e-4
    listed = [json.dumps(entry, default=str) for entry in spacy_accelerate.list_cached(cache_dir)]
    assert any(FAKE.value in entry for entry in listed)


def test_doctor_lists_it_and_its_runtime(fake, cache_dir: Path):
    result = CliRunner().invoke(app, ["doctor", "--json", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    listed = {status["provider"]: status for status in report["providers"]}
    assert listed[FAKE.value]["available"] is True
    assert any(line.startswith("FakeBackend: 0.1") for line in report["runtimes"])


def test_the_command_line_serves_it(fake, bert_path: Path, cache_dir: Path):
    args = ["optimize", str(bert_path), "--provider", FAKE.value, "--cache-dir", str(cache_dir)]
    result = CliRunner().invoke(app, [*args, "--no-overlap"])
    assert result.exit_code == 0, result.output
    assert f"transformer: served by {FAKE.value} fp32" in result.output


def test_the_table_refuses_a_fallback_loop_and_keeps_its_last_resort():
    with registered():
        with pytest.raises(ValueError, match="would fall back to itself"):
            PROVIDERS.register(replace(PROVIDERS[Provider.CPU], fallback=FAKE))
        with pytest.raises(ValueError, match="other providers fall back to 'cpu'"):
            PROVIDERS.remove("cpu")
    assert PROVIDERS.last_resort() is Provider.CPU
    assert PROVIDERS[Provider.CPU].fallback is None


def test_a_saved_provider_no_package_registered_here_says_what_to_import():
    with registered():
        saved = build_config(FAKE.value, "fp32", fallback=True)
    with pytest.raises(ProviderUnavailableError, match="'fake-cpu' is not registered here"):
        registry.fallback_chain(saved)
    with pytest.raises(ProviderUnavailableError, match="import the package that registers it"):
        registry.check_provider(saved)
