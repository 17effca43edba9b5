"""The options several commands share, and the settings they fill in.

Declared once so that a flag means the same, with the same help text, on every command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

HostOpt = Annotated[
    str | None, typer.Option(help="Address to bind (env TETHER_HOST; default 127.0.0.1).")
]
PortOpt = Annotated[int | None, typer.Option(help="Port (env TETHER_PORT; default 8000).")]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        help="SQLite path or postgresql:// URL (env TETHER_STORE; default DATA_DIR/tether.db)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="Default model spec: local, openai:<model>, ollama:<model> (env TETHER_MODEL)."
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Data directory (env TETHER_DATA_DIR; default ./.tether)."),
]
UrlOpt = Annotated[
    str | None, typer.Option(help="A tether server's URL (default: the local store).")
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", help="API key for --url.", envvar="TETHER_API_KEY"),
]


def settings(**overrides: object) -> Any:
    """Settings from the environment, with the flags given on the command line winning."""
    # Imported here: the server's settings are not needed to print --help.
    from tether.server.settings import Settings

    return Settings.from_env(**overrides)
