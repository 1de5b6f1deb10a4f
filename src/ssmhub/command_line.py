"""The argument parser of every ssmhub command-line tool (``ssmhub-train``, ``-eval``, ``-regular``, ``-synthetic``).

:class:`CommandLineParser` is ``argparse.ArgumentParser`` with three changes, so that the tools behave alike:

- an error is one line, ``prog: error: <message>``, with exit status 2 and a pointer to ``--help``
  (argparse prints up to 25 lines of usage before the message, which then scrolls out of sight);
- every long flag is accepted in both spellings, ``--max_length`` and ``--max-length``; ``--help`` and
  the README show the underscore one (transformers' ``HfArgumentParser`` style);
- flags are never abbreviated (``--lr`` must not silently mean ``--lr_scheduler``).

:meth:`CommandLineParser.bad_input_errors` turns the ValueError / FileNotFoundError that the tools'
checks raise (always before any work starts) into that same one-line error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

__all__ = ["BAD_INPUT_ERRORS", "CommandLineParser", "json_object", "one_line"]

# What the checks of the tools raise for bad input (an argument, a missing file); exit status 2.
BAD_INPUT_ERRORS = (ValueError, FileNotFoundError)


def one_line(message: object) -> str:
    """``message`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(message).split())


def _canonical(flag: str) -> str:
    """The spelling-independent form of a long flag: ``--max-length`` and ``--max_length`` -> ``--max_length``."""
    return "--" + flag[2:].replace("-", "_")


def json_object(text: str) -> dict:
    """argparse ``type`` of a ``--model_config``-style flag: a JSON object, or an error saying what was expected."""
    example = "'{\"hidden_size\": 256}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}); expected an object such as {example}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as {example}; got {text!r}")
    return value


class CommandLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors and both flag spellings (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        """argparse's, after rewriting each flag to the spelling it was declared with."""
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._declared_spellings(argv), namespace)

    def _declared_spellings(self, argv: list[str]) -> list[str]:
        """``argv`` with ``--a-b`` (or ``--a-b=v``) rewritten to ``--a_b`` where that is the declared flag
        (and the other way round); values and everything after ``--`` are left alone."""
        declared = {_canonical(flag): flag for flag in self._option_string_actions if flag.startswith("--")}
        rewritten = []
        for position, token in enumerate(argv):
            if token == "--":
                return rewritten + argv[position:]
            name, sep, value = token.partition("=")
            if name.startswith("--") and _canonical(name) in declared:
                token = declared[_canonical(name)] + sep + value
            rewritten.append(token)
        return rewritten

    def error(self, message: str) -> NoReturn:
        """argparse's usage errors: one line naming the argument, and where the options are listed."""
        self.fail(f"{message} (see {self.prog} --help)")

    def fail(self, message: object, status: int = 2) -> NoReturn:
        """Print ``prog: error: <message>`` on one line of stderr and exit with ``status``."""
        sys.stderr.flush()
        self.exit(status, f"{self.prog}: error: {one_line(message)}\n")

    @contextmanager
    def bad_input_errors(self, *errors: type[BaseException]) -> Iterator[None]:
        """Inside the block, a ValueError / FileNotFoundError (or one of ``errors``) ends the program with
        :meth:`fail`: one line, exit status 2."""
        try:
            yield
        except (*BAD_INPUT_ERRORS, *errors) as err:
            self.fail(err)
