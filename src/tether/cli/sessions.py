"""``tether sessions list|show|delete``: on the local store, or on a server with ``--url``."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tether.cli._options import DataDirOpt, KeyOpt, StoreOpt, UrlOpt
from tether.cli._output import errors, fail, out
from tether.cli._store import (
    delete_session,
    list_sessions,
    on_store,
    session_history,
    workspaces_of,
)
from tether.records import LOCAL_PRINCIPAL, Principal

OwnerOpt = Annotated[
    str,
    typer.Option(
        "--user",
        help="Whose sessions, on the local store (a script's Session(user_id=...), a key's user).",
    ),
]
TenantOpt = Annotated[str, typer.Option("--tenant", help="Their tenant, on the local store.")]

app = typer.Typer(
    help="List, show and delete sessions (local store or a server).", no_args_is_help=True
)

_LABELS = {
    "user": "[bold cyan]you[/]",
    "assistant": "[bold green]agent[/]",
    "tool_call": "[yellow]tool call[/]",
    "tool_result": "[yellow]tool result[/]",
    "summary": "[magenta]summary[/]",
    "handoff": "[magenta]handed to[/]",
}


@app.command("list")
def sessions_list(
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
    user: OwnerOpt = LOCAL_PRINCIPAL.user,
    tenant: TenantOpt = LOCAL_PRINCIPAL.tenant,
) -> None:
    """List your sessions."""
    with errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                rows = client.request("GET", "/v1/sessions", params={"limit": limit})["data"]
        else:
            owner = Principal(tenant, user)
            rows = on_store(data_dir, store, lambda s: list_sessions(s, limit, owner))
    table = Table("session", "agent", "updated")
    for r in rows:
        table.add_row(
            r["session_id"],
            r["agent"],
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["updated_at"])),
        )
    out.print(table)


@app.command("show")
def sessions_show(
    session_id: str,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
    user: OwnerOpt = LOCAL_PRINCIPAL.user,
    tenant: TenantOpt = LOCAL_PRINCIPAL.tenant,
) -> None:
    """Show a session's history."""
    with errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                items = client.request(
                    "GET", f"/v1/sessions/{session_id}/items", params={"limit": 1000}
                )["data"]
        else:
            owner = Principal(tenant, user)
            items = on_store(data_dir, store, lambda s: session_history(s, session_id, owner))
    for i in items:
        label = _LABELS.get(i["kind"], i["kind"])
        text = i["content"] if i["kind"] != "tool_call" else f"{i['tool_name']}({i['arguments']})"
        flags = []
        if not i["complete"]:
            flags.append("incomplete")
        if i["excluded"]:
            flags.append("failed turn")
        suffix = f" [dim]({', '.join(flags)})[/]" if flags else ""
        out.print(f"{label}: ", end="")
        out.print(text, markup=False, end="")
        out.print(suffix)


@app.command("delete")
def sessions_delete(
    session_id: str,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
    user: OwnerOpt = LOCAL_PRINCIPAL.user,
    tenant: TenantOpt = LOCAL_PRINCIPAL.tenant,
) -> None:
    """Delete a session and its history."""
    with errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                client.request("DELETE", f"/v1/sessions/{session_id}")
        elif not on_store(
            data_dir,
            store,
            lambda s: delete_session(
                s, session_id, Principal(tenant, user), workspaces_of(data_dir)
            ),
        ):
            raise fail(f"no session {session_id!r}")
    out.print(f"deleted {session_id}")
