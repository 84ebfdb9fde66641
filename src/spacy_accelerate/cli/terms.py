"""The command line's terms for the options a library message advises.

The library's errors carry the options they name or advise as data
(:class:`~spacy_accelerate.errors.Advice`), which ``str(error)`` spells as ``optimize()``'s
keyword arguments. The command line spells the same advice as the flag that sets the
option (``--precision bf16``, ``--fallback``, ``--calibration-file FILE``), so that a
message can be followed as written. A flag is the option's name with dashes, except for
the options listed here. This module imports nothing heavy: the command line uses it
before spaCy is loaded.
"""

from __future__ import annotations

from spacy_accelerate.errors import PYTHON, UNSET, Advice, OneOf, SpacyAccelerateError

#: Options the command line takes another way: a file of texts instead of a list, and
#: GPU settings (a nested mapping, given in Python or in the saved config: no flag).
SPELLED_OTHERWISE: dict[str, str | None] = {"calibration_texts": "--calibration-file", "gpu": None}

#: What a user types in place of a value the message leaves to them.
PLACEHOLDERS: dict[str, str] = {"calibration_texts": "FILE", "min_agreement": "ANNOTATION=BOUND"}


def flag_of(option: str) -> str | None:
    """The flag that sets ``optimize()``'s keyword ``option`` (None: no flag)."""
    if option in SPELLED_OTHERWISE:
        return SPELLED_OTHERWISE[option]
    return "--" + option.replace("_", "-")


class CommandLineTerms:
    """Advice as flags: ``--precision bf16``, ``--precision int8 or auto``, ``--fallback`` /
    ``--no-fallback``,
    ``--calibration-file FILE``, ``--min-agreement dep=BOUND``; an option without a flag
    keeps its Python spelling (``gpu={...}``, in the saved config)."""

    def spell(self, advice: Advice) -> str:
        flag = flag_of(advice.option)
        if flag is None:
            return PYTHON.spell(advice)
        if advice.item is not None:
            return f"{flag} {advice.item}=BOUND"
        value = advice.value
        if value is UNSET:
            return flag
        if value is Ellipsis:
            return f"{flag} {PLACEHOLDERS.get(advice.option, advice.option.upper())}"
        if isinstance(value, bool):
            return flag if value else f"--no-{flag[2:]}"
        if isinstance(value, OneOf):
            return f"{flag} {value.joined(str)}"
        return f"{flag} {value}"


COMMAND_LINE = CommandLineTerms()


def cli_message(error: BaseException | str) -> str:
    """``error``'s message with its advice spelled as flags (other errors as they are)."""
    if isinstance(error, SpacyAccelerateError):
        return error.spelled(COMMAND_LINE)
    return str(error)
