"""``tether chat``: a terminal conversation, local (in-process runtime) or against a server."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

from rich.console import Console

from tether.errors import ConfigError, TetherError
from tether.records import LOCAL_PRINCIPAL, SessionKey, new_session_id
from tether.server.settings import Settings

PROMPT = "you> "
EXIT = {"/exit", "/quit"}


def _show_event(out: Console, kind: str, data: dict[str, Any]) -> None:
    if kind == "message.delta":
        out.print(data.get("text", ""), end="", markup=False, highlight=False)
    elif kind == "tool.call":
        out.print(f"\n[yellow]→ {data.get('name')}({data.get('arguments')})[/]")
    elif kind == "tool.result":
        text = str(data.get("output", ""))
        out.print(f"[yellow]← {text[:200]}[/]", markup=True)
    elif kind == "tool.approval_requested":
        out.print(
            f"[red]approval requested for {data.get('name')}: refused "
            "(no approver in the terminal)[/]"
        )
    elif kind == "turn.ended":
        status = data.get("status")
        if status == "completed":
            out.print()
        else:
            reason = data.get("reason")
            error = f": {data['error']}" if data.get("error") else ""
            out.print(f"\n[red]turn {status} ({reason}){error}[/]")


async def _ainput(prompt: str) -> str:
    """input() on a daemon thread, so leaving the chat never waits for a blocked read."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str] = loop.create_future()

    def deliver(line: str | None, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(line or "")

    def read() -> None:
        try:
            line = input(prompt)
        except BaseException as exc:  # EOFError, KeyboardInterrupt: hand them to the loop
            loop.call_soon_threadsafe(deliver, None, exc)
            return
        loop.call_soon_threadsafe(deliver, line, None)

    threading.Thread(target=read, daemon=True).start()
    return await fut


def chat_local(
    out: Console,
    settings: Settings,
    target: str | None,
    agent_name: str | None,
    session_id: str | None,
) -> None:
    from tether.app import load_agents
    from tether.runtime import Runtime
    from tether.server.app import default_agent
    from tether.store import open_store_url

    agents = load_agents(target) if target else [default_agent(settings)]
    agent = next((a for a in agents if a.name == (agent_name or agents[0].name)), None)
    if agent is None:
        raise ConfigError(f"no agent named {agent_name!r}")
    sid = session_id or new_session_id()
    key = SessionKey.of(LOCAL_PRINCIPAL, sid)

    async def main() -> None:
        runtime = Runtime(
            open_store_url(settings.store_url),
            data_dir=settings.data_dir,
            agents=agents,
            default_model=settings.model,
        )
        async with runtime:
            record, created = await runtime.store.create_session(key, agent.name, exist_ok=True)
            verb = "new session" if created else "resuming session"
            out.print(
                f"[dim]{verb} {sid} with {record.agent} "
                f"(resume with --session {sid}; /exit to leave)[/]"
            )
            loop = asyncio.get_running_loop()
            cancels: set[asyncio.Future[Any]] = set()  # keeps cancel tasks referenced
            while True:
                try:
                    line = (await _ainput(PROMPT)).strip()
                except (EOFError, KeyboardInterrupt):
                    out.print()
                    return
                if not line:
                    continue
                if line in EXIT:
                    return
                turn = await runtime.scheduler.submit(key, line, principal=LOCAL_PRINCIPAL)

                def cancel_turn(turn_id: str = turn.id) -> None:
                    cancels.add(
                        asyncio.ensure_future(runtime.scheduler.cancel(key, turn_id, "cancelled"))
                    )

                loop.add_signal_handler(signal.SIGINT, cancel_turn)
                try:
                    async for event in runtime.scheduler.events(key, turn.id):
                        _show_event(out, event.type, event.data)
                finally:
                    loop.remove_signal_handler(signal.SIGINT)

    asyncio.run(main())


def chat_remote(
    out: Console,
    url: str,
    api_key: str | None,
    agent_name: str | None,
    session_id: str | None,
) -> None:
    from tether.client import Client

    with Client(url, api_key=api_key) as client:
        session = client.ensure_session(session_id, agent_name)
        sid = session["session_id"]
        out.print(
            f"[dim]session {sid} with {session['agent']} on {url} "
            f"(resume with --session {sid}; /exit to leave)[/]"
        )
        while True:
            try:
                line = input(PROMPT).strip()
            except (EOFError, KeyboardInterrupt):
                out.print()
                return
            if not line:
                continue
            if line in EXIT:
                return
            try:
                for event in client.stream_turn(sid, line):
                    _show_event(out, event.type, event.data)
            except KeyboardInterrupt:
                # Closing the stream cancels the turn (on_disconnect=cancel).
                out.print("\n[red]cancelled[/]")
            except TetherError as exc:
                out.print(f"[red]{exc}[/]")
