"""``tether db upgrade``: schema migrations, on demand."""

from __future__ import annotations

import typer

from tether.cli._options import DataDirOpt, StoreOpt
from tether.cli._output import out
from tether.cli._store import on_store

app = typer.Typer(help="Database maintenance.", no_args_is_help=True)


async def _opened(s: object) -> None:
    """Nothing to do: opening a store applies its pending migrations."""
    return None


@app.command("upgrade")
def db_upgrade(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """Apply pending schema migrations (the server also does this on start)."""
    on_store(data_dir, store, _opened)
    out.print("schema is up to date")
