"""Messages that say what is wrong and where: help shows every default (0 and 0.0
included), a bad --seed names the option, a KeyError reaching the command line is a sentence,
not a bare key name."""
from __future__ import annotations

import argparse

import pytest

from fpsim import cli
from fpsim.cli import main


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["train", "sweep", "sweep-plot", "reproduce", "plot"])
def test_help_shows_every_default_of_an_option_that_takes_a_value(command):
    parser = _subcommands()[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and not action.required \
                and action.dest != "help":
            assert "default" in formatter._get_help_string(action), (command, action.dest)


def test_train_seed_below_zero_names_the_option(capsys):
    assert main(["train", "--seed", "-1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "fpsim: error: seed (--seed) must be an integer >= 0, got -1"


def test_a_bare_key_error_becomes_a_sentence():
    line = cli._one_line(KeyError("lr"))
    assert line != "lr" and "'lr' is missing" in line
    assert cli._one_line(KeyError("load_state_dict: missing keys ['w']")) == \
        "load_state_dict: missing keys ['w']"
