"""The ``tether`` command: thin commands over the library.

Each command module defines its commands (a group its own sub-app) and knows nothing of this
package; the app is put together here, commands first, then the groups, in the order that
``tether --help`` lists them. Nothing imports this package back, so there is no import cycle.
"""

from __future__ import annotations

import os
import sys

import typer

from tether.cli import chat, db, keys, memory, serve, sessions
from tether.cli._output import configure_logging

app = typer.Typer(
    name="tether",
    help="Run LLM agents for many conversations at once, with real isolation between them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help text (click's layout), for every group and command: rich's panels put a type
    # tag on flags ("--insecure <bool>") and cut long words ("TETHER_DRAIN_TIMEOU…") at 80
    # columns; plain text wraps between words instead.
    rich_markup_mode=None,
)
app.command()(serve.serve)
app.command()(chat.chat)
app.command()(memory.forget)
app.add_typer(sessions.app, name="sessions")
app.add_typer(keys.app, name="keys")
app.add_typer(db.app, name="db")
app.add_typer(memory.knowledge_app, name="knowledge")


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    configure_logging()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
