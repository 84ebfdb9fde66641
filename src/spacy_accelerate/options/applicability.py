"""Which options a request reads: an option it would ignore is an error, never silent.

Each option of ``optimize()`` that shapes only some plans is read by those alone:

- ``tolerance=``: fp32 (its parity bound);
- ``min_cosine=``, ``min_agreement=``, ``calibration_texts=``: the lossy precisions
  (int8, bf16, fp16), which are judged on the calibration texts;
- ``device_id=``, ``gpu=``: the GPU providers (cuda, tensorrt);
- ``fallback=True``: a provider with somewhere to fall back to (tensorrt, cuda, openvino,
  and ``auto``), not the CPU, the last resort already.

The others (``cache_dir``, ``warmup``, ``verify``, ``threads``: every session's
intra-op threads, ``lock_timeout``, ``missing_cache``) apply everywhere.

A request may be served by several plans: ``provider="auto"`` by any provider,
``precision="auto"`` by every precision of its provider(s), and ``fallback=True`` by the
providers after it (at fp32 where one does not serve the precision asked for). An option
applies where *any* of them reads it (:func:`served_pairs`). Where the user gave an
option no plan reads, :func:`inapplicable` says so in ``optimize()``'s keyword terms
(``name=``), naming the provider and precision asked for and those that would read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spacy_accelerate.options.precision import LOSSY, Precision
from spacy_accelerate.options.providers import PROVIDERS, Provider

Pair = tuple[Provider, Precision]


def _served_as(provider: Provider, precision: Precision) -> Pair:
    """What a fallback to ``provider`` serves (as ``OptimizeConfig.served_by`` does): the
    precision asked for where it serves it, fp32 otherwise."""
    if PROVIDERS.serves(provider, precision):
        return provider, precision
    return provider, Precision.FP32


def served_pairs(provider: Provider, precision: Precision, fallback: bool) -> set[Pair]:
    """Every (provider, precision) that may serve the request on some machine; none for
    a request this release does not serve (``check_supported`` refuses it)."""
    if provider is not Provider.AUTO and precision is not Precision.AUTO:
        if not PROVIDERS.serves(provider, precision):
            return set()
    providers = PROVIDERS.names() if provider is Provider.AUTO else (provider,)
    if fallback:  # ``auto`` with fallback ends on the CPU, the others walk their order
        providers = tuple({p: None for q in providers for p in PROVIDERS.fallback_chain(q)})
    if precision is Precision.AUTO:
        return {(p, q) for p in providers for q in PROVIDERS.precisions_of(p)}
    pairs: set[Pair] = {(p, precision) for p in providers if PROVIDERS.serves(p, precision)}
    if fallback:
        first = providers[0] if provider is not Provider.AUTO else None
        pairs |= {_served_as(p, precision) for p in providers if p is not first}
    return pairs


def _quoted(values: Iterable[str]) -> str:
    listed = [repr(value) for value in values]
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " or " + listed[-1]


@dataclass(frozen=True)
class Rule:
    """Which plans read an option, and what to say where none does."""

    #: The keyword as ``optimize()`` spells it (``calibration_texts=``, ``fallback=True``).
    option: str
    reads: Callable[[Provider, Precision], bool]
    #: Where it applies and why, after "applies to" (read from the provider table when
    #: said, so that a registered provider is named too).
    where: Callable[[], str]
    #: What a request that does not read it does instead (or why it has no use for it).
    instead: Callable[[Provider, Precision], str]
    #: What to ask for instead of dropping it (None: nothing, only drop it).
    alternative: Callable[[Provider, Precision], str | None]


def _lossy(_provider: Provider, precision: Precision) -> bool:
    return precision in LOSSY


def _fp32(_provider: Provider, precision: Precision) -> bool:
    return precision is Precision.FP32


def _on_gpu(provider: Provider, _precision: Precision) -> bool:
    return PROVIDERS.on_gpu(provider)


def _falls_back(provider: Provider, _precision: Precision) -> bool:
    return provider is Provider.AUTO or PROVIDERS[provider].fallback is not None


def _providers_where(reads: Callable[[Provider, Precision], bool]) -> list[str]:
    return [row.provider.value for row in PROVIDERS if reads(row.provider, Precision.FP32)]


def _gpu_where(why: str) -> Callable[[], str]:
    return lambda: f"provider {_quoted([*_providers_where(_on_gpu), 'auto'])} ({why})"


def _ask_gpu(_provider: Provider, _precision: Precision) -> str:
    return f"provider={_quoted(_providers_where(_on_gpu))}"


def _fallback_where() -> str:
    names = _quoted([*_providers_where(_falls_back), "auto"])
    return f"provider {names} (they fall back towards {PROVIDERS.last_resort().value!r})"


def _ask_lossy(provider: Provider, _precision: Precision) -> str:
    if provider is Provider.AUTO:
        return "precision='auto' (or a lossy precision)"
    lossy = [q.value for q in PROVIDERS.precisions_of(provider) if q in LOSSY] + ["auto"]
    return f"precision={_quoted(lossy)}"


def _lossy_is_checked_instead(_provider: Provider, precision: Precision) -> str:
    return "is checked to tolerance= instead (its parity with PyTorch)"


_LOSSY_WHERE = "precision 'int8', 'bf16', 'fp16' or 'auto'"


def _lossy_where(why: str) -> Callable[[], str]:
    return lambda: f"{_LOSSY_WHERE} ({why})"


RULES: tuple[Rule, ...] = (
    Rule(
        "tolerance=",
        _fp32,
        lambda: (
            "precision 'fp32' or 'auto' (the largest absolute difference fp32 may have to PyTorch)"
        ),
        lambda _p, _q: (
            "is judged by min_cosine= and min_agreement= on the calibration texts instead"
        ),
        lambda _p, _q: "precision='fp32'",
    ),
    Rule(
        "min_cosine=",
        _lossy,
        _lossy_where("the least token cosine a lossy plan may have to PyTorch"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        "min_agreement=",
        _lossy,
        _lossy_where("a lossy plan's annotations of the calibration texts are judged on it"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        "calibration_texts=",
        _lossy,
        _lossy_where("they are judged on it"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        "device_id=",
        _on_gpu,
        _gpu_where("the GPU providers"),
        lambda _p, _q: "runs on the CPU",
        _ask_gpu,
    ),
    Rule(
        "gpu=",
        _on_gpu,
        _gpu_where("the GPU providers: buckets, CUDA graphs, TensorRT's builder"),
        lambda _p, _q: "runs on the CPU",
        _ask_gpu,
    ),
    Rule(
        "fallback=True",
        _falls_back,
        _fallback_where,
        lambda _p, _q: "is the last resort already: there is nothing to fall back to",
        lambda _p, _q: None,
    ),
)

RULE_OF: dict[str, Rule] = {rule.option: rule for rule in RULES}


def describe_request(provider: Provider, precision: Precision, fallback: bool) -> str:
    """The request as the messages name it."""
    named = f"provider={provider.value!r} with precision={precision.value!r}"
    return named + (" and fallback=True" if fallback else "")


def inapplicable(
    given: Iterable[str], provider: Provider, precision: Precision, fallback: bool
) -> list[str]:
    """For each option in ``given`` (keys of :data:`RULE_OF`) that no plan of the request
    reads, why, in ``optimize()``'s keyword terms. A request this release does not serve
    at all is left to :func:`~.config.check_supported` (nothing is said here)."""
    pairs = served_pairs(provider, precision, fallback)
    if not pairs:
        return []
    request = describe_request(provider, precision, fallback)
    problems: list[str] = []
    for option in given:
        rule = RULE_OF[option]
        if any(rule.reads(p, q) for p, q in pairs):
            continue
        alternative = rule.alternative(provider, precision)
        drop = f"Drop {option}" + (f", or ask for {alternative}" if alternative else "")
        problems.append(
            f"{option} applies to {rule.where()}; {request} "
            f"{rule.instead(provider, precision)}. {drop}."
        )
    return problems
