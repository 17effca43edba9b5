"""``tether chat``: a terminal conversation, local (in-process runtime) or against a server."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tether import events
from tether.cli._options import DataDirOpt, KeyOpt, ModelOpt, UrlOpt, settings
from tether.cli._output import errors, out
from tether.errors import ConfigError, TetherError
from tether.records import LOCAL_PRINCIPAL, SessionKey, new_session_id

if TYPE_CHECKING:
    from tether.client import Client
    from tether.server.settings import Settings

PROMPT = "you> "
EXIT = {"/exit", "/quit"}


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
    with errors():
        if url:
            chat_remote(out, url, key, agent, session)
        else:
            chat_local(out, settings(model=model, data_dir=data_dir), target, agent, session)


def _show_event(out: Console, kind: str, data: dict[str, Any]) -> None:
    # Everything that comes from the model, a tool or the server is printed as plain text:
    # brackets in it are not rich markup (and "[/x]" would otherwise crash the chat).
    if kind == events.MESSAGE_DELTA:
        out.print(data.get("text", ""), end="", markup=False, highlight=False)
    elif kind == events.TOOL_CALL:
        out.print()
        out.print(f"→ {data.get('name')}({data.get('arguments')})", style="yellow", markup=False)
    elif kind == events.TOOL_RESULT:
        text = str(data.get("output", ""))
        out.print(f"← {text[:200]}", style="yellow", markup=False)
    # tool.approval_requested: the chat asks the user (see _approval_question), nothing to show.
    elif kind == events.TURN_ENDED:
        status = data.get("status")
        if status == "completed":
            out.print()
        else:
            reason = data.get("reason")
            error = f": {data['error']}" if data.get("error") else ""
            out.print()
            out.print(f"turn {status} ({reason}){error}", style="red", markup=False)


def _approval_question(name: object, arguments: object) -> str:
    return f"approve {name}({arguments})? [y/N] "


def _approves(answer: str) -> bool:
    return answer.strip().lower() in ("y", "yes")


class _Terminal:
    """Reads lines on a daemon thread, so leaving the chat never waits for a blocked read.

    There is only ever one read in flight. A caller that stops waiting (Ctrl-C cancels a
    turn while its approval question is open) leaves that read to the next caller, whose
    prompt is printed instead: the line typed next is never swallowed by an abandoned read.
    """

    def __init__(self, out: Console) -> None:
        self._out = out
        self._reading: asyncio.Future[str] | None = None

    async def read(self, prompt: str) -> str:
        reading = self._reading
        if reading is None:
            reading = self._reading = self._start(prompt)
        elif not reading.done():
            self._out.print(prompt, end="", markup=False, highlight=False)
        try:
            # Shielded: cancelling this caller must not cancel the read (see the class doc).
            line = await asyncio.shield(reading)
        except asyncio.CancelledError:
            raise  # the read stays in flight for the next caller
        except BaseException:
            self._reading = None
            raise
        self._reading = None
        return line

    def _start(self, prompt: str) -> asyncio.Future[str]:
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
        return fut


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
    from tether.tools.approval import ApprovalRequest

    agents = load_agents(target) if target else [default_agent(settings)]
    agent = next((a for a in agents if a.name == (agent_name or agents[0].name)), None)
    if agent is None:
        raise ConfigError(f"no agent named {agent_name!r}")
    sid = session_id or new_session_id()
    key = SessionKey.of(LOCAL_PRINCIPAL, sid)
    terminal = _Terminal(out)

    async def ask(request: ApprovalRequest) -> bool:
        try:
            answer = await terminal.read(_approval_question(request.tool_name, request.arguments))
        except EOFError:
            return False
        return _approves(answer)

    async def main() -> None:
        runtime = Runtime(
            open_store_url(settings.store_url),
            data_dir=settings.data_dir,
            agents=agents,
            default_model=settings.model,
            approver=ask,
        )
        async with runtime:
            record, created = await runtime.sessions.create(key, agent.name, exist_ok=True)
            verb = "new session" if created else "resuming session"
            out.print(
                f"{verb} {sid} with {record.agent} (resume with --session {sid}; /exit to leave)",
                style="dim",
                markup=False,
            )
            loop = asyncio.get_running_loop()
            cancels: set[asyncio.Future[Any]] = set()  # keeps cancel tasks referenced
            while True:
                try:
                    line = (await terminal.read(PROMPT)).strip()
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
            f"session {sid} with {session['agent']} on {url} "
            f"(resume with --session {sid}; /exit to leave)",
            style="dim",
            markup=False,
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
                    if event.type == events.TOOL_APPROVAL_REQUESTED:
                        _decide_remote(out, client, sid, event.id, event.data)
            except KeyboardInterrupt:
                # Closing the stream cancels the turn (on_disconnect=cancel).
                out.print()
                out.print("cancelled", style="red")
            except TetherError as exc:
                out.print(str(exc), style="red", markup=False)


def _decide_remote(
    out: Console, client: Client, session_id: str, event_id: str, data: dict[str, Any]
) -> None:
    """Ask the user, and send the answer to the server, which is waiting for it."""
    try:
        approve = _approves(input(_approval_question(data.get("name"), data.get("arguments"))))
    except EOFError:
        approve = False
    turn_id = event_id.rpartition(":")[0]
    if not client.decide(session_id, turn_id, str(data.get("call_id")), approve):
        out.print("too late: the server had already refused the call", style="red")
