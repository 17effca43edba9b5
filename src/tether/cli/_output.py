"""The CLI's two consoles, its log lines, and how a command fails: one place, so every command
prints alike."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import typer
from rich.console import Console

from tether.errors import ConfigError, TetherError

# soft_wrap: lines are not broken at the terminal width (or at 80 columns into a pipe).
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """The library's errors (and a server out of reach) as one ``error:`` line, not a traceback."""
    try:
        yield
    except (ConfigError, TetherError) as exc:
        raise fail(str(exc)) from None
    except (ConnectionError, TimeoutError) as exc:
        raise fail(str(exc)) from None


def configure_logging() -> None:
    """Warnings and errors on stderr, one line each; nothing below (``serve`` configures its
    own log, see tether.server.log_config). Set before any library can set it on import."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
