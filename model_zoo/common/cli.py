"""The model zoo's command-line promise: bad input is one line on stderr, exit status 2, nothing written.

``InputError`` is a user-input problem (a path, a file's format, an option's value), found before
anything is written whenever it can be. ``TrainingFailed`` is a run that started and cannot go on
(e.g. its parameters became non-finite): one line, exit status 1, its last good checkpoint kept.
``run_main`` turns both into that line and status; this module imports no MindSpore.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional

__all__ = ["InputError", "TrainingFailed", "OneLineArgumentParser", "run_main"]


class InputError(Exception):
    """A user-input problem: reported as one line, exit status 2, no traceback."""


class TrainingFailed(Exception):
    """A started run that had to stop: reported as one line, exit status 1, no traceback."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as ``InputError`` (one line) instead of usage + error."""

    def error(self, message: str):  # argparse API: must not return
        raise InputError(message)


def run_main(main: Callable[[Optional[List[str]]], object], argv: Optional[List[str]], prog: str) -> int:
    """Run ``main(argv)`` and return the exit status: its own (an int, or 0), 2 for ``InputError``,
    1 for ``TrainingFailed``, 130 for Ctrl-C; the two errors print ``PROG: error: MESSAGE`` on stderr."""
    try:
        result = main(argv)
    except InputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except TrainingFailed as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
