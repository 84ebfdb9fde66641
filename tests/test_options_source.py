"""One source for ``optimize()``'s options: its signature, the load callbacks and the
command line take the names of :class:`OptimizeOptions`, with the same defaults."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import typer.main
import typer.models

from spacy_accelerate.api import make_optimize_callback, optimize
from spacy_accelerate.cli.optimize import optimize as optimize_command
from spacy_accelerate.cli.terms import flag_of
from spacy_accelerate.options.request import OptimizeOptions, OptimizeRequest

OPTIONS = {f.name: f.default for f in fields(OptimizeOptions)}


def _defaults(function) -> dict[str, object]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def test_optimize_takes_exactly_the_options_with_their_defaults():
    assert _defaults(optimize) == OPTIONS


def test_the_saved_record_holds_every_option_with_its_default():
    record = {f.name: f.default for f in fields(OptimizeRequest) if f.default is not MISSING}
    assert {name: record[name] for name in OPTIONS} == OPTIONS


def test_the_load_callback_takes_every_option_with_its_default():
    callback = _defaults(make_optimize_callback)
    assert {name: callback[name] for name in OPTIONS} == OPTIONS


def test_the_command_line_takes_the_options_with_their_defaults():
    click_command = typer.main.get_command_from_info(
        typer.models.CommandInfo(callback=optimize_command),
        pretty_exceptions_short=True,
        rich_markup_mode=None,
    )
    command = {parameter.name: parameter.default for parameter in click_command.params}
    flags = {opt for parameter in click_command.params for opt in parameter.opts}
    for name, default in OPTIONS.items():
        flag = flag_of(name)  # the flag a message advises for it, as the command line has it
        if flag is None:
            continue
        assert flag in flags, f"{flag} is missing from the command line"
        if flag != f"--{name.replace('_', '-')}":  # a file of texts instead of a list
            continue
        assert name in command, f"{flag} is missing from the command line"
        assert command[name] == default, name
