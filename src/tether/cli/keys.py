"""``tether keys create|list|revoke``: API keys, on the local store (no HTTP route makes them)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tether.cli._options import DataDirOpt, StoreOpt
from tether.cli._output import err, fail, out
from tether.cli._store import list_api_keys, on_store, revoke_api_key, save_api_key

app = typer.Typer(help="Create, list and revoke API keys (stored hashed).", no_args_is_help=True)


def _check_name(label: str, value: str) -> None:
    # A principal is a namespace: an empty or blank name would be a shared, unnamed one.
    if not value or len(value) > 128 or not value.isprintable() or any(c.isspace() for c in value):
        raise fail(f"{label} must be 1-128 printable characters without spaces")


@app.command("create")
def keys_create(
    user: Annotated[str, typer.Option(help="The user the key acts as.")],
    tenant: Annotated[str, typer.Option(help="The user's tenant.")] = "default",
    admin: Annotated[bool, typer.Option(help="Grant the admin role.")] = False,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Create an API key; it is printed once, as the last word of the last line."""
    from tether.server.auth import mint_key

    for label, value in (("--user", user), ("--tenant", tenant)):
        _check_name(label, value)
    new = mint_key(user, tenant, admin=admin)
    on_store(data_dir, store, lambda s: save_api_key(s, new.record))
    err.print(
        f"created key {new.record.id} for {tenant}/{user}"
        f"{' (admin)' if admin else ''}; it is shown only once:"
    )
    print(new.secret)


@app.command("list")
def keys_list(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """List API keys (never their secrets)."""
    table = Table("id", "tenant", "user", "roles", "created", "status")
    for k in on_store(data_dir, store, list_api_keys):
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
    if not on_store(data_dir, store, lambda s: revoke_api_key(s, key_id)):
        raise fail(f"no active key {key_id!r}")
    out.print(f"revoked {key_id}")
