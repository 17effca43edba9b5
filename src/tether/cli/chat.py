"""``tether chat``: a terminal conversation, local (in-process runtime) or against a server.

Both ends read the same prompt: a message goes to the agent, a ``/command`` never does
(see _chat_commands). Ctrl-C cancels a reply while it streams, and leaves at the prompt.
What a turn asks a human (a tool approval, the model's question) is asked inline, decided,
and the same turn streams on to its end (see _chat_decisions).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tether import _wire, events
from tether.cli._chat_commands import (
    HISTORY_EXCHANGES,
    RESUME_EXCHANGES,
    Command,
    help_text,
    parse,
    unknown,
)
from tether.cli._chat_decisions import again, as_answer, asking, reading
from tether.cli._chat_history import Exchanges, HistoryItem, show
from tether.cli._chat_view import ending, show_event
from tether.cli._options import DataDirOpt, KeyOpt, ModelOpt, UrlOpt, settings
from tether.cli._output import errors, out
from tether.cli._terminal import Interrupted, Terminal, read_prompt
from tether.errors import ConfigError, DecisionMade, TetherError
from tether.records import (
    LOCAL_PRINCIPAL,
    Decision,
    Event,
    SessionKey,
    Turn,
    Verdict,
    new_session_id,
)

if TYPE_CHECKING:
    from tether.client import Client
    from tether.runtime import DecisionAnswer, Runtime
    from tether.server.settings import Settings

PROMPT = "you> "
INTERRUPTED_EXIT = 130  # the shell's code for a program ended by Ctrl-C
_PAGE = 500


def chat(
    target: Annotated[
        str | None,
        typer.Argument(
            help="module:app, path/to/app.py:app or agents.yaml for local chat "
            "(default: the 'assistant' agent)."
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
    # Ctrl-C is how a user stops a reply or leaves, so it must reach us even when whoever
    # started this process ignored SIGINT (a job started with & from a script): Python then
    # keeps the ignore, and KeyboardInterrupt would never come.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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


def _pending(data: dict[str, Any]) -> bool:
    return data.get("status") == "pending"


def _settles(event: Event, asked: dict[str, Any]) -> bool:
    """Whether ``event`` means the question ``asked`` is no longer the user's to answer."""
    if event.type == events.TURN_ENDED:
        return True
    return event.type == events.DECISION_MADE and event.data.get("call_id") == asked.get("call_id")


async def _abandon(future: asyncio.Future[Any] | None) -> None:
    if future is not None and not future.done():
        future.cancel()
        await asyncio.wait({future})


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
    def __init__(self, out: Console, runtime: Runtime, agent: str, terminal: Terminal) -> None:
        self.out = out
        self.runtime = runtime
        self.agent = agent
        self.terminal = terminal
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
        ahead = asyncio.ensure_future(self._ahead_of(turn))

        def cancel_turn() -> None:
            cancel = self.runtime.scheduler.cancel(key, turn.id, "cancelled")
            self._cancels.add(asyncio.ensure_future(cancel))
            ahead.cancel()  # stop asking an earlier turn's question: that turn is not ours

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, cancel_turn)
        try:
            try:
                await ahead
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                self.out.print()
                self.out.print(
                    "cancelled; the earlier turn still waits for its decision", style="yellow"
                )
                return
            stream = self.runtime.scheduler.events(key, turn.id)
            try:
                await self._follow(stream)
            finally:
                await stream.aclose()
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    async def _ahead_of(self, turn: Turn) -> None:
        """An earlier turn that waits for a human (another client left it so) holds ``turn``
        back: its question is shown and asked here, and it is followed to its end, as many
        times as that takes (before, the chat waited on ``turn``'s events, which could not come
        before someone decided)."""
        scheduler = self.runtime.scheduler
        while (ahead := await scheduler.parked_ahead(turn)) is not None:
            pending = await scheduler.decisions(self.key, turn_id=ahead.id, status="pending")
            calls = {d.call_id for d in pending}
            asked = await self.runtime.sessions.stored_events(self.key, ahead.id)
            # From just before its first question still open: what it said before was seen
            # where it was sent.
            start = next(
                (
                    e.seq - 1
                    for e in asked
                    if e.type == events.DECISION_REQUESTED and e.data.get("call_id") in calls
                ),
                asked[-1].seq if asked else 0,
            )
            self.out.print(
                f"turn {ahead.id}, sent before this message, waits for a decision first",
                style="yellow",
            )
            stream = scheduler.events(self.key, ahead.id, after_seq=start)
            try:
                await self._follow(stream)
            finally:
                await stream.aclose()

    async def _follow(self, stream: AsyncGenerator[Event, None]) -> None:
        """Show the turn's events; a question it asks is read while its events go on being
        awaited, so a turn that goes on without the answer (Ctrl-C cancelled it, its deadline
        passed, someone decided elsewhere) takes the question away."""
        upcoming = asyncio.ensure_future(anext(stream, None))
        asking: asyncio.Future[tuple[Verdict, str | None]] | None = None
        about: dict[str, Any] = {}
        try:
            while True:
                waits: set[asyncio.Future[Any]] = (
                    {upcoming} if asking is None else {upcoming, asking}
                )
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if asking is not None and asking.done():
                    await self._decide(about, *asking.result())
                    asking = None
                    continue
                event = upcoming.result()
                if event is None:
                    return
                upcoming = asyncio.ensure_future(anext(stream, None))
                if asking is not None and _settles(event, about):
                    await _abandon(asking)  # its read stays in flight for the next prompt
                    asking = None
                show_event(self.out, event.type, event.data)
                if event.type == events.DECISION_REQUESTED and _pending(event.data):
                    about = event.data
                    asking = asyncio.ensure_future(self._ask(about))
        finally:
            await _abandon(asking)
            await _abandon(upcoming)  # the stream is then free to be closed

    async def _decide(self, data: dict[str, Any], verdict: Verdict, answer: str | None) -> None:
        try:
            await self.runtime.decide(
                self.key,
                str(data["turn_id"]),
                str(data["call_id"]),
                verdict,
                answer=answer,
                principal=LOCAL_PRINCIPAL,
            )
        except DecisionMade as exc:
            self.out.print(f"too late: it was {exc.decision.status} meanwhile", style="red")

    async def _ask(self, data: dict[str, Any]) -> tuple[Verdict, str | None]:
        kind, payload = data.get("kind"), data.get("payload") or {}
        question = asking(kind, payload)
        for line in question.lines:
            self.out.print(line, markup=False, highlight=False)
        while True:
            try:
                line = await self.terminal.read(question.prompt)
            except EOFError:
                return "deny", None
            verdict = reading(kind, payload, line)
            if verdict is not None:
                return verdict
            self.out.print(again(payload), style="yellow", markup=False)

    async def run(self) -> int:
        while True:
            try:
                line = parse(await read_prompt(self.terminal, PROMPT))
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

    agents = load_agents(target) if target else [default_agent(settings)]
    agent = next((a for a in agents if a.name == (agent_name or agents[0].name)), None)
    if agent is None:
        known = ", ".join(a.name for a in agents)
        raise ConfigError(f"no agent named {agent_name!r} (the agents here: {known})")

    async def main() -> int:
        # No on_decision: what a turn asks parks it, and the chat asks (see _LocalChat._decide).
        runtime = Runtime(
            open_store_url(settings.store_url),
            data_dir=settings.data_dir,
            agents=agents,
            default_model=settings.model,
        )
        async with runtime:
            chat = _LocalChat(out, runtime, agent.name, Terminal(out))
            await chat.open(session_id or new_session_id())
            return await chat.run()

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
        if agent:
            # As the local chat checks it: a session that exists already would otherwise be
            # resumed with its own agent, the name asked for silently set aside.
            listed = self.client.request("GET", "/v1/agents")["data"]
            names = [a["name"] for a in listed]
            if agent not in names:
                known = ", ".join(names)
                raise ConfigError(f"no agent named {agent!r} (the agents there: {known})")
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
            self._earlier()
        except KeyboardInterrupt:
            # Nothing was sent, and following the earlier turn never cancels it.
            self.out.print()
            self.out.print(
                "not sent; the earlier turn still waits for its decision", style="yellow"
            )
            return
        except TetherError as exc:
            self.out.print(str(exc), style="red", markup=False)
            return
        try:
            for event in self.client.stream_turn(self.sid, text, on_decision=self._ask):
                show_event(self.out, event.type, event.data)
        except KeyboardInterrupt:
            # Closing the stream cancels the turn (on_disconnect=cancel).
            self.out.print()
            self.out.print(ending("cancelled", "client_disconnected"), style="red")
        except TetherError as exc:
            self.out.print(str(exc), style="red", markup=False)

    def _earlier(self) -> None:
        """An earlier turn that waits for a human (another client left it so) would hold a new
        message back, and its stream would show nothing until someone decided: its question is
        shown and asked first, and it is followed to its end, as many times as that takes."""
        while pending := self.client.decisions(self.sid, status="pending"):
            waiting = pending[0].turn_id
            calls = {d.call_id for d in pending if d.turn_id == waiting}
            self.out.print(
                f"turn {waiting}, sent before this message, waits for a decision first",
                style="yellow",
            )
            # Its events from the start, shown from its first question still open on (what it
            # said before was seen where it was sent); a question replayed from before that
            # one was decided already and is not asked.
            showing = False
            for event in self.client.follow_turn(self.sid, waiting):
                showing = showing or (
                    event.type == events.DECISION_REQUESTED and event.data.get("call_id") in calls
                )
                if not showing:
                    continue
                show_event(self.out, event.type, event.data)
                if event.type == events.DECISION_REQUESTED:
                    d = _wire.decision_of(self.sid, event.data)
                    verdict, answer = _wire.ask(self._ask, d)
                    try:
                        self.client.decide(self.sid, d.turn_id, d.call_id, verdict, answer)
                    except DecisionMade as exc:
                        self.out.print(
                            f"too late: it was {exc.decision.status} meanwhile", style="red"
                        )

    def _ask(self, d: Decision) -> DecisionAnswer:
        """Ask the user; the client sends the answer to the server, where the turn waits."""
        question = asking(d.kind, d.payload)
        for line in question.lines:
            self.out.print(line, markup=False, highlight=False)
        while True:
            try:
                line = input(question.prompt)
            except EOFError:
                return False
            verdict = reading(d.kind, d.payload, line)
            if verdict is not None:
                return as_answer(*verdict)
            self.out.print(again(d.payload), style="yellow", markup=False)

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
