"""``tether keys create|list|revoke``: API keys, on the local store (no HTTP route makes them)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tether.cli._options import DataDirOpt, StoreOpt
from tether.cli._output import err, fail, out
from tether.cli._store import on_store
from tether.errors import ConfigError
from tether.keys import ApiKeys, NewKey, check_name, check_tenant

app = typer.Typer(help="Create, list and revoke API keys (stored hashed).", no_args_is_help=True)


@app.command("create")
def keys_create(
    user: Annotated[str, typer.Option(help="The user the key acts as.")],
    tenant: Annotated[str, typer.Option(help="The user's tenant.")] = "default",
    admin: Annotated[bool, typer.Option(help="Grant the admin role.")] = False,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Create an API key; it is printed once, as the last word of the last line."""
    try:
        check_name("--user", user)
        check_name("--tenant", tenant)
        check_tenant(tenant)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    new: NewKey = on_store(data_dir, store, lambda s: ApiKeys(s).create(user, tenant, admin=admin))
    err.print(
        f"created key {new.record.id} for {tenant}/{user}"
        f"{' (admin)' if admin else ''}; it is shown only once:"
    )
    print(new.secret)


@app.command("list")
def keys_list(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """List API keys (never their secrets)."""
    table = Table("id", "tenant", "user", "roles", "created", "status")
    for k in on_store(data_dir, store, lambda s: ApiKeys(s).list()):
        table.add_row(
            k.id,
            k.tenant,
            k.user,
            ",".join(sorted(k.roles)) or "-",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(k.created_at)),
            "revoked" if k.revoked_at else "active",
        )
    out.print(table)


@app.command("revoke")
def keys_revoke(key_id: str, data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """Revoke an API key by id (requests with it get 401 from then on)."""
    if not on_store(data_dir, store, lambda s: ApiKeys(s).revoke(key_id)):
        raise fail(f"no active key {key_id!r}")
    out.print(f"revoked {key_id}")
