"""``tether chat``: a terminal conversation, local (in-process runtime) or against a server.

Both ends read the same prompt: a message goes to the agent, a ``/command`` never does
(see _chat_commands). Ctrl-C cancels a reply while it streams, and leaves at the prompt.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tether import events
from tether.cli._chat_commands import (
    HISTORY_EXCHANGES,
    RESUME_EXCHANGES,
    Command,
    help_text,
    parse,
    unknown,
)
from tether.cli._chat_history import Exchanges, HistoryItem, show
from tether.cli._chat_view import approval_question, approves, ending, show_event
from tether.cli._options import DataDirOpt, KeyOpt, ModelOpt, UrlOpt, settings
from tether.cli._output import errors, out
from tether.cli._terminal import Interrupted, Terminal, read_prompt
from tether.errors import ConfigError, TetherError
from tether.records import LOCAL_PRINCIPAL, SessionKey, new_session_id

if TYPE_CHECKING:
    from tether.client import Client
    from tether.runtime import Runtime
    from tether.server.settings import Settings

PROMPT = "you> "
INTERRUPTED_EXIT = 130  # the shell's code for a program ended by Ctrl-C
_PAGE = 500


def chat(
    target: Annotated[
        str | None,
        typer.Argument(
            help="module:app or agents.yaml for local chat (default: the 'assistant' agent)."
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Agent name.")] = None,
    session: Annotated[
        str | None, typer.Option(help="Resume this session id (its last exchanges are shown).")
    ] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    model: ModelOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Chat in the terminal: streams tokens, shows tool calls and each turn's outcome.

    \b
    At the prompt:
      /help      the commands
      /history   the conversation so far
      /new       a new session with the same agent
      /exit      leave (or Ctrl-D; Ctrl-C at the prompt leaves too)

    Ctrl-C while a reply streams cancels it. A line starting with / is never sent to the agent
    (type //text to send "/text").
    """
    with errors():
        if url:
            code = chat_remote(out, url, key, agent, session)
        else:
            code = chat_local(out, settings(model=model, data_dir=data_dir), target, agent, session)
    if code:
        raise typer.Exit(code)


def _banner(out: Console, verb: str, sid: str, agent: str, where: str = "") -> None:
    out.print(
        f"{verb} {sid} with {agent}{where} (resume with --session {sid}; /help for commands)",
        style="dim",
        markup=False,
    )


def _left(out: Console, sid: str) -> int:
    out.print()
    out.print(f"left the chat (Ctrl-C); resume it with --session {sid}", style="dim", markup=False)
    return INTERRUPTED_EXIT


def _without_session(out: Console, command: Command) -> bool:
    """Handle what needs no session (/help, unknown commands); True when it was one of those."""
    if command.name == "/help":
        out.print(help_text(), markup=False, highlight=False)
        return True
    if not command.known:
        out.print(unknown(command), style="yellow", markup=False)
        return True
    return False


# -- local: an in-process runtime on the local store -------------------------------------------
class _LocalChat:
    def __init__(self, out: Console, runtime: Runtime, agent: str) -> None:
        self.out = out
        self.runtime = runtime
        self.agent = agent
        self.key = SessionKey.of(LOCAL_PRINCIPAL, "-")
        self._cancels: set[asyncio.Future[Any]] = set()  # keeps cancel tasks referenced

    async def open(self, sid: str) -> None:
        self.key = SessionKey.of(LOCAL_PRINCIPAL, sid)
        record, created = await self.runtime.sessions.create(self.key, self.agent, exist_ok=True)
        # The session's own agent answers (a session the Python API made before any agent has
        # none: the one chosen here does).
        self.agent = record.agent or self.agent
        _banner(self.out, "new session" if created else "resuming session", sid, self.agent)
        if not created:
            await self.show_history(RESUME_EXCHANGES, quiet_if_empty=True)

    async def show_history(self, keep: int, *, quiet_if_empty: bool = False) -> None:
        exchanges = Exchanges(keep)
        after = 0
        while True:
            page = await self.runtime.sessions.items(self.key, after=after, limit=_PAGE)
            for item in page:
                exchanges.add(HistoryItem.of(item))
            if len(page) < _PAGE:
                break
            after = page[-1].seq
        if exchanges.total or not quiet_if_empty:
            show(self.out, exchanges, self.agent)

    async def send(self, text: str) -> None:
        turn = await self.runtime.scheduler.submit(
            self.key, text, principal=LOCAL_PRINCIPAL, agent=self.runtime.served(self.agent).ref
        )
        key = self.key

        def cancel_turn() -> None:
            cancel = self.runtime.scheduler.cancel(key, turn.id, "cancelled")
            self._cancels.add(asyncio.ensure_future(cancel))

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, cancel_turn)
        try:
            async for event in self.runtime.scheduler.events(key, turn.id):
                show_event(self.out, event.type, event.data)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    async def run(self, terminal: Terminal) -> int:
        while True:
            try:
                line = parse(await read_prompt(terminal, PROMPT))
            except EOFError:
                self.out.print()
                return 0
            except Interrupted:
                return _left(self.out, self.key.session_id)
            if line is None:
                continue
            if isinstance(line, str):
                await self.send(line)
            elif line.name == "/exit":
                return 0
            elif line.name == "/new":
                await self.open(new_session_id())
            elif line.name == "/history":
                await self.show_history(HISTORY_EXCHANGES)
            else:
                _without_session(self.out, line)


def chat_local(
    out: Console,
    settings: Settings,
    target: str | None,
    agent_name: str | None,
    session_id: str | None,
) -> int:
    from tether.app import load_agents
    from tether.runtime import Runtime
    from tether.server.app import default_agent
    from tether.store import open_store_url
    from tether.tools.approval import ApprovalRequest

    agents = load_agents(target) if target else [default_agent(settings)]
    agent = next((a for a in agents if a.name == (agent_name or agents[0].name)), None)
    if agent is None:
        known = ", ".join(a.name for a in agents)
        raise ConfigError(f"no agent named {agent_name!r} (the agents here: {known})")
    terminal = Terminal(out)

    async def ask(request: ApprovalRequest) -> bool:
        try:
            answer = await terminal.read(approval_question(request.tool_name, request.arguments))
        except EOFError:
            return False
        return approves(answer)

    async def main() -> int:
        runtime = Runtime(
            open_store_url(settings.store_url),
            data_dir=settings.data_dir,
            agents=agents,
            default_model=settings.model,
            approver=ask,
        )
        async with runtime:
            chat = _LocalChat(out, runtime, agent.name)
            await chat.open(session_id or new_session_id())
            return await chat.run(terminal)

    return asyncio.run(main())


# -- remote: a tether server over HTTP -----------------------------------------------------------
class _RemoteChat:
    def __init__(self, out: Console, client: Client, url: str) -> None:
        self.out = out
        self.client = client
        self.url = url
        self.sid = ""
        self.agent = ""

    def open(self, session_id: str | None, agent: str | None) -> None:
        session = self.client.ensure_session(session_id, agent)
        self.sid, self.agent = session["session_id"], session["agent"]
        _banner(self.out, "session", self.sid, self.agent, f" on {self.url}")
        if session.get("item_count"):
            self.show_history(RESUME_EXCHANGES)

    def show_history(self, keep: int) -> None:
        exchanges = Exchanges(keep)
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": _PAGE, **({"cursor": cursor} if cursor else {})}
            page = self.client.request("GET", f"/v1/sessions/{self.sid}/items", params=params)
            for item in page["data"]:
                exchanges.add(HistoryItem.from_json(item))
            cursor = page.get("next_cursor")
            if not cursor:
                break
        show(self.out, exchanges, self.agent)

    def send(self, text: str) -> None:
        try:
            for event in self.client.stream_turn(self.sid, text):
                show_event(self.out, event.type, event.data)
                if event.type == events.TOOL_APPROVAL_REQUESTED:
                    self._decide(event.id, event.data)
        except KeyboardInterrupt:
            # Closing the stream cancels the turn (on_disconnect=cancel).
            self.out.print()
            self.out.print(ending("cancelled", "client_disconnected"), style="red")
        except TetherError as exc:
            self.out.print(str(exc), style="red", markup=False)

    def _decide(self, event_id: str, data: dict[str, Any]) -> None:
        """Ask the user, and send the answer to the server, which is waiting for it."""
        try:
            approve = approves(input(approval_question(data.get("name"), data.get("arguments"))))
        except EOFError:
            approve = False
        turn_id = event_id.rpartition(":")[0]
        if not self.client.decide(self.sid, turn_id, str(data.get("call_id")), approve):
            self.out.print("too late: the server had already refused the call", style="red")

    def run(self) -> int:
        while True:
            try:
                line = parse(input(PROMPT))
            except EOFError:
                self.out.print()
                return 0
            except KeyboardInterrupt:
                return _left(self.out, self.sid)
            if line is None:
                continue
            if isinstance(line, str):
                self.send(line)
            elif line.name == "/exit":
                return 0
            elif line.name == "/new":
                self.open(None, self.agent)
            elif line.name == "/history":
                self.show_history(HISTORY_EXCHANGES)
            else:
                _without_session(self.out, line)


def chat_remote(
    out: Console,
    url: str,
    api_key: str | None,
    agent_name: str | None,
    session_id: str | None,
) -> int:
    from tether.client import Client

    with Client(url, api_key=api_key) as client:
        chat = _RemoteChat(out, client, url)
        chat.open(session_id, agent_name)
        return chat.run()
