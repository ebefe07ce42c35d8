"""How every ``lamina`` command prints its help: each option's help line ends with its default
unless it already says it (``default`` in the text), descriptions keep their line breaks."""

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
    so the whole ``lamina`` tree formats alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
