"""How every ``lamina`` command prints its help and reads its command line: each option's help
line ends with its default unless it already says it (``default`` in the text), descriptions
keep their line breaks, and a command's positionals may come before, between or after its
options (``lamina send orders --priority 1 urgent``)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["HelpFormatter", "Parser"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default X)`` to the help of an option that takes a value and has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and action.nargs != 0 and "default" not in text.lower()
                and action.default not in (None, argparse.SUPPRESS, [])):
            text += " (default %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with ``HelpFormatter``; subcommand parsers are of the same class,
    so the whole ``lamina`` tree formats alike.

    A command without subcommands parses intermixed (``parse_known_intermixed_args``): plain
    argparse fills a list positional (``BODY...``, ``NAME=VALUE...``) at its first run of
    positionals and refuses those after an option as unrecognized."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back here, twice
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
