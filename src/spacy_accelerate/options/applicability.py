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
option no plan reads, :func:`inapplicable` says so, naming the option (an
:class:`~spacy_accelerate.errors.Advice`, spelled in each interface's terms), the provider
and precision asked for and those that would read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spacy_accelerate.errors import Advice, OneOf, Said
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


@dataclass(frozen=True)
class Rule:
    """Which plans read an option, and what to say where none does."""

    #: The option as messages name it (``Advice("calibration_texts")``,
    #: ``Advice("fallback", True)``).
    option: Advice
    reads: Callable[[Provider, Precision], bool]
    #: Where it applies and why, after "applies to" (read from the provider table when
    #: said, so that a registered provider is named too).
    where: Callable[[], Said]
    #: What a request that does not read it does instead (or why it has no use for it).
    instead: Callable[[Provider, Precision], Said]
    #: What to ask for instead of dropping it (None: nothing, only drop it).
    alternative: Callable[[Provider, Precision], Said | None]


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


def _one_of(option: str, values: list[str]) -> Said:
    """``option`` set to one of ``values``: ``precision='int8', 'bf16' or 'auto'``."""
    return (Advice(option, OneOf(tuple(values))),)


def _gpu_where(why: str) -> Callable[[], Said]:
    return lambda: (*_one_of("provider", [*_providers_where(_on_gpu), "auto"]), f" ({why})")


def _ask_gpu(_provider: Provider, _precision: Precision) -> Said:
    return _one_of("provider", _providers_where(_on_gpu))


def _fallback_where() -> Said:
    last = PROVIDERS.last_resort().value
    names = _one_of("provider", [*_providers_where(_falls_back), "auto"])
    return (*names, f" (they fall back towards {last!r})")


def _ask_lossy(provider: Provider, _precision: Precision) -> Said:
    if provider is Provider.AUTO:
        return (Advice("precision", "auto"), " (or a lossy precision)")
    lossy = [q.value for q in PROVIDERS.precisions_of(provider) if q in LOSSY] + ["auto"]
    return _one_of("precision", lossy)


def _lossy_is_checked_instead(_provider: Provider, precision: Precision) -> Said:
    return ("is checked to ", Advice("tolerance"), " instead (its parity with PyTorch)")


def _lossy_where(why: str) -> Callable[[], Said]:
    lossy = [precision.value for precision in Precision if precision in LOSSY]
    return lambda: (*_one_of("precision", [*lossy, "auto"]), f" ({why})")


RULES: tuple[Rule, ...] = (
    Rule(
        Advice("tolerance"),
        _fp32,
        lambda: (
            *_one_of("precision", [Precision.FP32.value, Precision.AUTO.value]),
            " (the largest absolute difference fp32 may have to PyTorch)",
        ),
        lambda _p, _q: (
            "is judged by ",
            Advice("min_cosine"),
            " and ",
            Advice("min_agreement"),
            " on the calibration texts instead",
        ),
        lambda _p, _q: (Advice("precision", "fp32"),),
    ),
    Rule(
        Advice("min_cosine"),
        _lossy,
        _lossy_where("the least token cosine a lossy plan may have to PyTorch"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        Advice("min_agreement"),
        _lossy,
        _lossy_where("a lossy plan's annotations of the calibration texts are judged on it"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        Advice("calibration_texts"),
        _lossy,
        _lossy_where("they are judged on it"),
        _lossy_is_checked_instead,
        _ask_lossy,
    ),
    Rule(
        Advice("device_id"),
        _on_gpu,
        _gpu_where("the GPU providers"),
        lambda _p, _q: ("runs on the CPU",),
        _ask_gpu,
    ),
    Rule(
        Advice("gpu"),
        _on_gpu,
        _gpu_where("the GPU providers: buckets, CUDA graphs, TensorRT's builder"),
        lambda _p, _q: ("runs on the CPU",),
        _ask_gpu,
    ),
    Rule(
        Advice("fallback", True),
        _falls_back,
        _fallback_where,
        lambda _p, _q: ("is the last resort already: there is nothing to fall back to",),
        lambda _p, _q: None,
    ),
)

#: The rules by option name (``optimize()``'s keyword).
RULE_OF: dict[str, Rule] = {rule.option.option: rule for rule in RULES}


def describe_request(provider: Provider, precision: Precision, fallback: bool) -> Said:
    """The request as the messages name it."""
    named: Said = (
        Advice("provider", provider.value),
        " with ",
        Advice("precision", precision.value),
    )
    return named + ((" and ", Advice("fallback", True)) if fallback else ())


def inapplicable(
    given: Iterable[str], provider: Provider, precision: Precision, fallback: bool
) -> list[Said]:
    """For each option in ``given`` (keys of :data:`RULE_OF`) that no plan of the request
    reads, why, the options named as :class:`~spacy_accelerate.errors.Advice`. A request
    this release does not serve at all is left to :func:`~.config.check_supported`
    (nothing is said here)."""
    pairs = served_pairs(provider, precision, fallback)
    if not pairs:
        return []
    request = describe_request(provider, precision, fallback)
    problems: list[Said] = []
    for name in given:
        rule = RULE_OF[name]
        if any(rule.reads(p, q) for p, q in pairs):
            continue
        alternative = rule.alternative(provider, precision)
        drop: Said = ("Drop ", rule.option)
        if alternative is not None:
            drop += (", or ask for ", *alternative)
        problems.append(
            (rule.option, " applies to ", *rule.where(), "; ", *request, " ")
            + (*rule.instead(provider, precision), ". ", *drop, ".")
        )
    return problems
