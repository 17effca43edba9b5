"""The ``tether`` command: thin commands over the library."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from tether.errors import ConfigError, TetherError

if TYPE_CHECKING:
    from tether.store.protocol import Store

T = TypeVar("T")

app = typer.Typer(
    name="tether",
    help="Run LLM agents for many conversations at once, with real isolation between them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sessions_app = typer.Typer(
    help="List, show and delete sessions (local store or a server).", no_args_is_help=True
)
keys_app = typer.Typer(
    help="Create, list and revoke API keys (stored hashed).", no_args_is_help=True
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")

# soft_wrap: lines are not broken at the terminal width (or at 80 columns into a pipe).
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

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


def _redacted(url: str) -> str:
    """A store URL fit for logs: any password replaced."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


def _settings(**overrides: object) -> Any:
    from tether.server.settings import Settings

    return Settings.from_env(**overrides)


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    try:
        return asyncio.run(main())
    except TetherError as exc:
        raise fail(str(exc)) from None


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except (ConfigError, TetherError) as exc:
        raise fail(str(exc)) from None
    except (ConnectionError, TimeoutError) as exc:
        raise fail(str(exc)) from None


# -- serve --------------------------------------------------------------------------------------
@app.command()
def serve(
    target: Annotated[
        str | None,
        typer.Argument(
            help="module:app (an App, Agent or list of agents) or agents.yaml; "
            "default: one 'assistant' agent on the default model."
        ),
    ] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    store: StoreOpt = None,
    model: ModelOpt = None,
    data_dir: DataDirOpt = None,
    insecure: Annotated[
        bool,
        typer.Option(
            help="Allow a non-loopback bind with no API keys (everyone gets full access)."
        ),
    ] = False,
    node: Annotated[str | None, typer.Option(help="Stable node name (env TETHER_NODE).")] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            min=0,
            envvar="TETHER_DRAIN_TIMEOUT",
            help="Seconds running turns get to finish on SIGTERM/SIGINT before they are "
            "cancelled with reason 'shutdown' (default 10).",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP server (SQLite under ./.tether and the embedded model by default)."""
    from tether.app import check_bind, load_agents
    from tether.app import serve as run_server
    from tether.server.app import default_agent

    with _errors():
        settings = _settings(
            host=host,
            port=port,
            store=store,
            model=model,
            data_dir=data_dir,
            insecure=insecure or None,
            node=node,
            drain_timeout=drain_timeout,
        )
        agents = load_agents(target) if target else [default_agent(settings)]
        check_bind(settings)  # refuse before announcing anything
        err.print(
            f"tether: serving {', '.join(a.name for a in agents)} on "
            f"http://{settings.host}:{settings.port} (store {_redacted(settings.store_url)})"
        )
        run_server(settings, agents, log_level=log_level)


# -- chat ---------------------------------------------------------------------------------------
@app.command()
def chat(
    target: Annotated[
        str | None,
        typer.Argument(
            help="module:app or agents.yaml for local chat (default: the 'assistant' agent)."
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Agent name.")] = None,
    session: Annotated[str | None, typer.Option(help="Resume this session id.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    model: ModelOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Chat in the terminal: streams tokens, shows tool calls and each turn's outcome.

    Type /exit (or Ctrl-D) to leave; Ctrl-C cancels the reply in progress.
    """
    from tether.chat_cli import chat_local, chat_remote

    with _errors():
        if url:
            chat_remote(out, url, key, agent, session)
        else:
            settings = _settings(model=model, data_dir=data_dir)
            chat_local(out, settings, target, agent, session)


# -- sessions -----------------------------------------------------------------------------------
def _local_key(session_id: str) -> Any:
    from tether.records import LOCAL_PRINCIPAL, SessionKey

    return SessionKey.of(LOCAL_PRINCIPAL, session_id)


def _on_store(data_dir: Path | None, store: str | None, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``fn`` on the local store (opened, migrated, and closed again)."""

    async def go() -> T:
        s = _open_store(data_dir, store)
        await s.open()
        try:
            return await fn(s)
        finally:
            await s.close()

    return _run(go)


def _open_store(data_dir: Path | None, store: str | None) -> Store:
    from tether.store import open_store_url

    return open_store_url(_settings(data_dir=data_dir, store=store).store_url)


@sessions_app.command("list")
def sessions_list(
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List your sessions."""
    with _errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                rows = client.request("GET", "/v1/sessions", params={"limit": limit})["data"]
        else:

            async def load(s: Store) -> list[dict[str, Any]]:
                records = await s.list_sessions("local", "local", limit=limit)
                return [
                    {
                        "session_id": r.key.session_id,
                        "agent": r.agent,
                        "updated_at": r.updated_at,
                    }
                    for r in records
                ]

            rows = _on_store(data_dir, store, load)
    table = Table("session", "agent", "updated")
    for r in rows:
        table.add_row(
            r["session_id"],
            r["agent"],
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["updated_at"])),
        )
    out.print(table)


@sessions_app.command("show")
def sessions_show(
    session_id: str,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Show a session's history."""
    with _errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                items = client.request(
                    "GET", f"/v1/sessions/{session_id}/items", params={"limit": 1000}
                )["data"]
        else:

            async def load(s: Store) -> list[dict[str, Any]]:
                k = _local_key(session_id)
                if await s.get_session(k) is None:
                    raise ConfigError(f"no session {session_id!r}")
                return [
                    {
                        "kind": i.kind,
                        "content": i.content,
                        "complete": i.complete,
                        "tool_name": i.tool_name,
                        "arguments": i.arguments,
                        "excluded": i.excluded,
                    }
                    for i in await s.list_items(k, limit=100_000)
                ]

            items = _on_store(data_dir, store, load)
    for i in items:
        label = {
            "user": "[bold cyan]you[/]",
            "assistant": "[bold green]agent[/]",
            "tool_call": "[yellow]tool call[/]",
            "tool_result": "[yellow]tool result[/]",
            "summary": "[magenta]summary[/]",
        }.get(i["kind"], i["kind"])
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


@sessions_app.command("delete")
def sessions_delete(
    session_id: str,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Delete a session and its history."""
    with _errors():
        if url:
            from tether.client import Client

            with Client(url, api_key=key) as client:
                client.request("DELETE", f"/v1/sessions/{session_id}")
        else:

            async def delete(s: Store) -> bool:
                deleted: bool = await s.delete_session(_local_key(session_id))
                return deleted

            if not _on_store(data_dir, store, delete):
                raise fail(f"no session {session_id!r}")
    out.print(f"deleted {session_id}")


# -- keys ---------------------------------------------------------------------------------------
@keys_app.command("create")
def keys_create(
    user: Annotated[str, typer.Option(help="The user the key acts as.")],
    tenant: Annotated[str, typer.Option(help="The user's tenant.")] = "default",
    admin: Annotated[bool, typer.Option(help="Grant the admin role.")] = False,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Create an API key; it is printed once, as the last word of the last line."""
    from tether.keys import mint_key

    for label, value in (("--user", user), ("--tenant", tenant)):
        # A principal is a namespace: an empty or blank name would be a shared, unnamed one.
        if (
            not value
            or len(value) > 128
            or not value.isprintable()
            or any(c.isspace() for c in value)
        ):
            raise fail(f"{label} must be 1-128 printable characters without spaces")
    new = mint_key(user, tenant, admin=admin)

    async def save(s: Store) -> None:
        await s.create_api_key(new.record)

    _on_store(data_dir, store, save)
    err.print(
        f"created key {new.record.id} for {tenant}/{user}"
        f"{' (admin)' if admin else ''}; it is shown only once:"
    )
    print(new.secret)


@keys_app.command("list")
def keys_list(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """List API keys (never their secrets)."""

    async def load(s: Store) -> list[Any]:
        keys: list[Any] = await s.list_api_keys()
        return keys

    table = Table("id", "tenant", "user", "roles", "created", "status")
    for k in _on_store(data_dir, store, load):
        table.add_row(
            k.id,
            k.tenant,
            k.user,
            ",".join(sorted(k.roles)) or "-",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(k.created_at)),
            "revoked" if k.revoked_at else "active",
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str, data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """Revoke an API key by id (requests with it get 401 from then on)."""

    async def revoke(s: Store) -> bool:
        done: bool = await s.revoke_api_key(key_id)
        return done

    if not _on_store(data_dir, store, revoke):
        raise fail(f"no active key {key_id!r}")
    out.print(f"revoked {key_id}")


# -- db -----------------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(data_dir: DataDirOpt = None, store: StoreOpt = None) -> None:
    """Apply pending schema migrations (the server also does this on start)."""

    async def upgrade(s: Store) -> None:
        return None

    _on_store(data_dir, store, upgrade)
    out.print("schema is up to date")


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()


# The memory commands live in their own module; importing it registers them on ``app``.
from tether import cli_memory  # noqa: E402, F401
