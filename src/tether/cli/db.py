"""``tether db upgrade``: schema migrations, on demand."""

from __future__ import annotations

import typer

from tether.cli._options import DataDirOpt, StoreOpt
from tether.cli._output import out
from tether.cli._store import on_store

app = typer.Typer(help="Database maintenance.", no_args_is_help=True)


async def _opened(s: object) -> tuple[int, int] | None:
    """Opening a store applies its pending migrations: the versions before and after."""
    migrated: tuple[int, int] | None = getattr(s, "migrated", None)
    return migrated


@app.command("upgrade")
def db_upgrade(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """Apply pending schema migrations (the server also does this on start)."""
    migrated = on_store(data_dir, store, _opened)
    if migrated is None:
        out.print("schema is up to date")
    elif migrated[0] == 0:
        out.print(f"schema made: version {migrated[1]}")
    elif migrated[0] < migrated[1]:
        out.print(f"schema upgraded: version {migrated[0]} -> {migrated[1]}")
    else:
        out.print(f"schema is up to date: version {migrated[1]}")
