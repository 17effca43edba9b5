"""``tether chat`` in a real pseudo-terminal, against a server (``--url``) and locally."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pexpect
import pytest
from rich.console import Console

from tests.server import apps
from tests.server.conftest import PYTHONPATH, ROOT, Server
from tether.cli._chat_view import show_event
from tether.testing.fake_openai import FakeOpenAIServer
from tether.tools.approval import REFUSED_RESULT

TETHER = [sys.executable, "-m", "tether"]
PROMPT = "you> "
TIMEOUT = 30
APPROVE_LAUNCH = 'approve launch({"target": "rocket"})? [y/n/always] '


def spawn(*args: str, env: dict[str, str] | None = None) -> pexpect.spawn:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200", **(env or {})}
    child = pexpect.spawn(
        TETHER[0],
        [*TETHER[1:], "chat", *args],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(40, 200),
    )
    return child


@pytest.fixture
def children() -> Iterator[list[pexpect.spawn]]:
    """Every chat process a test starts is gone (and its pty closed) when the test ends."""
    started: list[pexpect.spawn] = []
    yield started
    for child in started:
        child.close(force=True)


def session_of(child: pexpect.spawn) -> str:
    child.expect(r"session (\S+) with echo")
    sid: str = child.match.group(1)
    child.expect_exact(PROMPT)
    return sid


def say(child: pexpect.spawn, text: str, reply: str) -> None:
    child.sendline(text)
    child.expect_exact(reply)
    child.expect_exact(PROMPT)


def plain(screen: str | None) -> str:
    """What was shown, without terminal colour codes or surrounding blank space."""
    return re.sub(r"\x1b\[[0-9;]*m", "", screen or "").strip()


def leave(child: pexpect.spawn) -> None:
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


# -- against a server -------------------------------------------------------------------------
@pytest.mark.slow
def test_remote_chat_keeps_the_conversation_and_resumes_it(
    server: Server, children: list[pexpect.spawn]
) -> None:
    first = spawn("--url", server.url, "--agent", "echo")
    children.append(first)
    sid = session_of(first)
    say(first, "hello there", "saw [] then hello there")
    say(first, "second one", "saw [hello there] then second one")
    leave(first)

    again = spawn("--url", server.url, "--session", sid)
    children.append(again)
    assert session_of(again) == sid
    say(again, "third", "saw [hello there, second one] then third")
    leave(again)

    with server.client() as c:
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [i["content"] for i in items if i["kind"] == "user"] == [
        "hello there",
        "second one",
        "third",
    ]


@pytest.mark.slow
def test_remote_chat_ends_on_eof(server: Server, children: list[pexpect.spawn]) -> None:
    child = spawn("--url", server.url, "--agent", "echo")
    children.append(child)
    session_of(child)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_remote_ctrl_c_cancels_the_reply_in_progress(
    server: Server, children: list[pexpect.spawn]
) -> None:
    with server.client() as c:
        sid = c.post("/v1/sessions", json={"agent": "slow"}).json()["session_id"]
    child = spawn("--url", server.url, "--session", sid)
    children.append(child)
    child.expect_exact(f"session {sid} with slow")
    child.expect_exact(PROMPT)
    child.sendline("go")
    child.expect_exact("w3 ")
    child.sendintr()
    child.expect_exact("turn cancelled")
    child.expect_exact(PROMPT)  # the chat goes on
    with server.client() as c:
        turn = wait_ended(c, sid)
    assert (turn["status"], turn["reason"], turn["complete"]) == (
        "cancelled",
        "client_disconnected",
        False,
    )
    leave(child)


def wait_ended(c: httpx.Client, sid: str) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        if turns and turns[-1]["status"] not in ("queued", "running"):
            last: dict[str, object] = turns[-1]
            return last
        assert time.monotonic() < deadline, turns
        time.sleep(0.05)


@pytest.mark.slow
def test_remote_chat_with_an_unreachable_server_fails_cleanly(
    children: list[pexpect.spawn],
) -> None:
    from tests.server.conftest import free_port

    child = spawn("--url", f"http://127.0.0.1:{free_port()}", "--agent", "echo")
    children.append(child)
    child.expect("cannot reach")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert "Traceback" not in (child.before or "")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "result"),
    [("y", "launched rocket"), ("n", REFUSED_RESULT), ("sure", REFUSED_RESULT)],
)
def test_remote_chat_asks_for_approval_and_sends_the_answer(
    server: Server, children: list[pexpect.spawn], answer: str, result: str
) -> None:
    child = spawn("--url", server.url, "--agent", "approver")
    children.append(child)
    child.expect(r"session (\S+) with approver")
    sid = child.match.group(1)
    child.expect_exact(PROMPT)
    began = time.monotonic()
    child.sendline("launch it")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline(answer)
    child.expect_exact(f"tool said: {result}")
    child.expect_exact(PROMPT)
    # Answered at once, not after the server's approval timeout (30 s) ran out.
    assert time.monotonic() - began < 10
    leave(child)
    with server.client() as c:
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [i["content"] for i in items if i["kind"] == "tool_result"] == [result]


# -- local (in-process runtime) ----------------------------------------------------------------
@pytest.mark.slow
def test_local_chat_keeps_the_conversation_and_resumes_it(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    data = str(tmp_path / "data")
    args = ("tests.server.apps:app", "--agent", "echo", "--data-dir", data)
    first = spawn(*args)
    children.append(first)
    first.expect(r"new session (\S+) with echo")
    sid = first.match.group(1)
    first.expect_exact(PROMPT)
    say(first, "hello there", "saw [] then hello there")
    say(first, "second one", "saw [hello there] then second one")
    leave(first)

    again = spawn(*args, "--session", sid)
    children.append(again)
    again.expect_exact(f"resuming session {sid} with echo")
    again.expect_exact(PROMPT)
    say(again, "third", "saw [hello there, second one] then third")
    leave(again)


@pytest.mark.slow
def test_local_ctrl_c_cancels_the_reply_in_progress(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    data = str(tmp_path / "data")
    child = spawn("tests.server.apps:app", "--agent", "slow", "--data-dir", data)
    children.append(child)
    child.expect(r"new session (\S+) with slow")
    child.expect_exact(PROMPT)
    child.sendline("go")
    child.expect_exact("w3 ")
    child.sendintr()
    child.expect_exact("turn cancelled")
    child.expect_exact(PROMPT)
    assert plain(child.before) == "", child.before  # not "turn cancelled (cancelled)"
    leave(child)


@pytest.mark.slow
@pytest.mark.parametrize("session", [None, "known-remote-1"])
def test_remote_chat_with_an_unknown_agent_fails_cleanly(
    server: Server, children: list[pexpect.spawn], session: str | None
) -> None:
    """Even when the session exists already (it was resumed with its own agent, the name
    asked for set aside), as the local chat refuses it."""
    with server.client() as c:
        c.post("/v1/sessions", json={"agent": "echo", "session_id": "known-remote-1"})
    args = ["--url", server.url, "--agent", "nobody"]
    child = spawn(*args, *(["--session", session] if session else []))
    children.append(child)
    child.expect_exact("no agent named 'nobody' (the agents there: ")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


@pytest.mark.slow
def test_local_chat_with_an_unknown_agent_fails_cleanly(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    data = str(tmp_path / "data")
    child = spawn("tests.server.apps:app", "--agent", "nobody", "--data-dir", data)
    children.append(child)
    known = ", ".join(a.name for a in apps.agents)
    child.expect_exact(f"no agent named 'nobody' (the agents here: {known})")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "result"),
    [("yes", "launched rocket"), ("", REFUSED_RESULT)],
)
def test_local_chat_asks_for_approval(
    tmp_path: Path, children: list[pexpect.spawn], answer: str, result: str
) -> None:
    data = str(tmp_path / "data")
    child = spawn("tests.server.apps:app", "--agent", "approver", "--data-dir", data)
    children.append(child)
    child.expect_exact(PROMPT)
    child.sendline("launch it")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline(answer)
    child.expect_exact(f"tool said: {result}")
    child.expect_exact(PROMPT)
    leave(child)


@pytest.mark.slow
def test_local_ctrl_c_at_an_approval_question_cancels_and_keeps_the_next_line(
    tmp_path: Path, children: list[pexpect.spawn]
) -> None:
    data = str(tmp_path / "data")
    child = spawn("tests.server.apps:app", "--agent", "approver", "--data-dir", data)
    children.append(child)
    child.expect_exact(PROMPT)
    child.sendline("launch it")
    child.expect_exact("[y/n/always] ")
    child.sendintr()
    child.expect_exact("turn cancelled")
    child.expect_exact(PROMPT)
    assert plain(child.before) == "", child.before
    # The line typed next is the next message (the abandoned question does not eat it).
    child.sendline("again")
    child.expect_exact("[y/n/always] ")
    child.sendline("y")
    child.expect_exact("tool said: launched rocket")
    child.expect_exact(PROMPT)
    leave(child)


# -- either end: slash-commands, resuming, leaving ---------------------------------------------
Start = Callable[..., pexpect.spawn]


@pytest.fixture(params=["local", "remote"])
def start_chat(
    request: pytest.FixtureRequest, tmp_path: Path, children: list[pexpect.spawn]
) -> Start:
    """Starts ``tether chat`` with the given flags, locally or against the module's server."""

    def start(*args: str) -> pexpect.spawn:
        if request.param == "remote":
            server: Server = request.getfixturevalue("server")
            child = spawn("--url", server.url, *args)
        else:
            child = spawn("tests.server.apps:app", "--data-dir", str(tmp_path / "data"), *args)
        children.append(child)
        return child

    return start


@pytest.mark.slow
def test_slash_commands_are_never_sent_to_the_agent(start_chat: Start) -> None:
    child = start_chat("--agent", "echo")
    sid = session_of(child)
    child.sendline("/help")
    child.expect_exact("the conversation so far")
    child.expect_exact("start a new session with the same agent")
    child.expect_exact(PROMPT)
    child.sendline("/foo bar")
    child.expect_exact("unknown command /foo (not sent to the model)")
    child.expect_exact(PROMPT)
    # Neither /help nor /foo reached the model: this is the first message it sees.
    say(child, "//etc is a folder", "saw [] then /etc is a folder")
    say(child, "and more", "saw [/etc is a folder] then and more")

    child.sendline("/history")
    child.expect_exact("earlier in this session: all 2 exchanges")
    child.expect_exact("you: /etc is a folder")
    child.expect_exact("echo: saw [/etc is a folder] then and more")
    child.expect_exact(PROMPT)

    child.sendline("/new")
    child.expect(r"session (\S+) with echo")
    assert child.match.group(1) != sid
    child.expect_exact(PROMPT)
    say(child, "fresh", "saw [] then fresh")
    leave(child)


@pytest.mark.slow
def test_resuming_a_session_shows_its_last_exchanges(start_chat: Start) -> None:
    first = start_chat("--agent", "echo")
    sid = session_of(first)
    for word in ("one", "two", "three", "four"):
        say(first, word, f"then {word}")
    leave(first)

    again = start_chat("--agent", "echo", "--session", sid)
    again.expect_exact("earlier in this session: the last 3 of 4 exchanges")
    again.expect_exact(PROMPT)
    shown = again.before or ""
    assert "you: two" in shown and "echo: saw [one, two, three] then four" in shown, shown
    assert "you: one" not in shown
    say(again, "five", "saw [one, two, three, four] then five")
    leave(again)


@pytest.mark.slow
def test_ctrl_c_at_the_prompt_leaves_with_a_message(start_chat: Start) -> None:
    child = start_chat("--agent", "echo")
    sid = session_of(child)
    say(child, "hello", "saw [] then hello")  # after a turn, whose own Ctrl-C handler is gone
    child.sendintr()
    child.expect_exact(f"left the chat (Ctrl-C); resume it with --session {sid}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert "Traceback" not in (child.before or "")


@pytest.mark.slow
def test_chat_with_an_openai_model_prints_no_request_log(
    tmp_path: Path, children: list[pexpect.spawn], fake_openai: FakeOpenAIServer
) -> None:
    data = str(tmp_path / "data")
    child = spawn(
        "tests.server.apps:app",
        *("--agent", "upstream", "--data-dir", data),
        env={"FAKE_OPENAI_URL": fake_openai.base_url},
    )
    children.append(child)
    screen = io.StringIO()
    child.logfile_read = screen
    child.expect_exact(PROMPT)
    say(child, "hi there", "echo: hi there")
    leave(child)
    assert "HTTP Request" not in screen.getvalue() and "httpx" not in screen.getvalue()


@pytest.mark.slow
def test_chat_asks_the_models_question_and_the_turn_goes_on(start_chat: Start) -> None:
    child = start_chat("--agent", "asker")
    child.expect_exact(PROMPT)
    child.sendline("pick one")
    child.expect_exact("? Which planet?")
    child.expect_exact("1. Mars")
    child.expect_exact("2. Venus")
    child.expect_exact(CHOOSE)
    child.sendline("7")  # not a choice: asked again, nothing sent
    child.expect_exact("pick 1-2 or type one of the choices (empty declines)")
    child.expect_exact(CHOOSE)
    child.sendline("2")
    child.expect_exact("noted: The user answered: Venus")
    child.expect_exact(PROMPT)
    # The text of a choice picks it too; a question without choices takes free text.
    child.sendline("pick again")
    child.expect_exact(CHOOSE)
    child.sendline("mars")
    child.expect_exact("noted: The user answered: Mars")
    child.expect_exact(PROMPT)
    child.sendline("hello")
    child.expect_exact("? What is your name?")
    child.expect_exact(FREE_TEXT)
    child.sendline("Ada Lovelace")
    child.expect_exact("noted: The user answered: Ada Lovelace")
    child.expect_exact(PROMPT)
    # An empty answer declines: the model is told so, and the turn still completes.
    child.sendline("hello again")
    child.expect_exact(FREE_TEXT)
    child.sendline("")
    child.expect_exact("noted: The user did not answer the question")
    child.expect_exact(PROMPT)
    leave(child)


@pytest.mark.slow
def test_always_approves_the_tool_for_the_rest_of_the_session(start_chat: Start) -> None:
    child = start_chat("--agent", "approver")
    sid = session_of_any(child)
    child.sendline("launch it")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline("always")
    child.expect_exact("tool said: launched rocket")
    child.expect_exact(PROMPT)
    child.sendline("and again")
    child.expect_exact("tool said: launched rocket")
    shown = plain(child.before)
    assert "→ launch" in shown and "approve" not in shown, shown  # not asked the second time
    child.expect_exact(PROMPT)
    leave(child)
    # A new session of the same agent asks again.
    other = start_chat("--agent", "approver")
    assert session_of_any(other) != sid
    other.sendline("launch it")
    other.expect_exact(APPROVE_LAUNCH)
    other.sendline("n")
    other.expect_exact(f"tool said: {REFUSED_RESULT}")
    other.expect_exact(PROMPT)
    leave(other)


CHOOSE = "answer (a number or the text; empty declines): "
FREE_TEXT = "answer (empty declines): "


def session_of_any(child: pexpect.spawn) -> str:
    child.expect(r"session (\S+) with")
    sid: str = child.match.group(1)
    child.expect_exact(PROMPT)
    return sid


# -- help ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        ([], ["serve", "chat", "sessions", "keys"]),
        (["chat"], ["--url", "--agent", "--session", "--key", "--data-dir", "/exit"]),
        (
            ["serve"],
            ["--host", "--port", "--data-dir", "--store", "--insecure", "--drain-timeout"],
        ),
        (["sessions"], ["list", "show", "delete"]),
        (["keys"], ["create", "list", "revoke"]),
    ],
)
def test_help(command: list[str], mentions: list[str]) -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(
        [*TETHER, *command, "--help"], capture_output=True, text=True, env=env, timeout=30
    )
    assert done.returncode == 0, done.stderr
    for word in mentions:
        assert word in done.stdout, (word, done.stdout)
    # Environment hints survive rendering (brackets would be eaten as markup).
    if command in (["serve"], ["chat"]):
        assert re.search(r"env TETHER_DATA_DIR", done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "env_name"),
    [(["serve"], "TETHER_DRAIN_TIMEOUT"), (["chat"], "TETHER_API_KEY"), (["sessions", "list"], "")],
)
def test_help_reads_well_in_80_columns(command: list[str], env_name: str) -> None:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    done = subprocess.run(
        [*TETHER, *command, "--help"], capture_output=True, text=True, env=env, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout  # a flag takes no value: no type tag
    assert "…" not in done.stdout  # nothing is cut off
    assert env_name in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


# -- rendering ------------------------------------------------------------------------------------
def test_model_and_tool_text_is_never_markup() -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    hostile = "[/oops] [bold]not bold[/bold] [link=http://x]y[/link]"
    show_event(console, "message.delta", {"text": hostile})
    show_event(console, "tool.call", {"name": "t", "arguments": '{"a": "[/b]"}'})
    show_event(console, "tool.result", {"output": hostile})
    show_event(console, "turn.ended", {"status": "failed", "reason": "x", "error": "[/e]"})
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert shown.count(hostile) == 2
    assert '{"a": "[/b]"}' in shown
    assert "turn failed (x): [/e]" in shown


@pytest.mark.parametrize(
    ("status", "reason", "line"),
    [
        ("completed", "answered", None),
        ("cancelled", "cancelled", "turn cancelled"),
        ("cancelled", "client_disconnected", "turn cancelled"),
        ("cancelled", "shutdown", "turn cancelled: the server is shutting down"),
        ("interrupted", "interrupt", "turn interrupted by a newer message"),
        ("limit_reached", "token_budget", "turn stopped: it used up the agent's token_budget"),
        ("failed", "model_error", "turn failed (model_error)"),
    ],
)
def test_a_turn_that_did_not_complete_is_said_once_in_words(
    status: str, reason: str, line: str | None
) -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    show_event(console, "turn.ended", {"status": status, "reason": reason})
    assert console.file.getvalue().strip() == (line or "")  # type: ignore[attr-defined]


# -- a turn left waiting by another client -------------------------------------------------------
async def _park_locally(data: Path, sid: str) -> None:
    """A turn of the session ``sid`` on ``data``'s store that waits for an approval, as a
    script's ``Agent.chat`` without ``on_decision`` leaves it."""
    from tether.records import LOCAL_PRINCIPAL, SessionKey
    from tether.runtime import Runtime
    from tether.store import open_store_url

    runtime = Runtime(open_store_url(str(data / "tether.db")), data_dir=data, agents=apps.agents)
    async with runtime:
        key = SessionKey.of(LOCAL_PRINCIPAL, sid)
        await runtime.sessions.create(key, "approver")
        turn = await runtime.scheduler.submit(
            key, "launch it", principal=LOCAL_PRINCIPAL, agent=runtime.served("approver").ref
        )
        parked = await runtime.scheduler.wait(key, turn.id, until_input=True)
        assert parked.status == "awaiting_input"


def _left_waiting(request: pytest.FixtureRequest, tmp_path: Path, sid: str) -> Server | None:
    """A turn of ``sid`` that waits for an approval, as another client left it: through the
    module's server for the remote chat (returned), on the local store for the local one."""
    if request.node.callspec.params["start_chat"] == "remote":
        server: Server = request.getfixturevalue("server")
        with server.client() as c:
            body = {"message": "launch it", "agent_name": "approver", "session_id": sid}
            assert c.post("/api/chat", json=body).status_code == 202
        return server
    asyncio.run(_park_locally(tmp_path / "data", sid))
    return None


@pytest.mark.slow
def test_a_message_behind_a_turn_left_waiting_asks_that_turns_question_first(
    start_chat: Start, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Before, the chat followed only its new turn, which could not start before someone
    # decided the earlier one: nothing was shown, for ever.
    sid = "left-waiting"
    _left_waiting(request, tmp_path, sid)
    child = start_chat("--agent", "approver", "--session", sid)
    child.expect_exact(PROMPT)
    child.sendline("and then?")
    child.expect_exact("sent before this message, waits for a decision first")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline("y")
    child.expect_exact("tool said: launched rocket")
    child.expect_exact(APPROVE_LAUNCH)  # the new message's own turn asks in its turn
    child.sendline("n")
    child.expect_exact(f"tool said: {REFUSED_RESULT}")
    child.expect_exact(PROMPT)
    leave(child)


@pytest.mark.slow
def test_ctrl_c_at_an_earlier_turns_question_leaves_that_turn_waiting(
    start_chat: Start, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Before, the remote chat said "turn cancelled" for a message it never sent; the local
    # one went on asking the earlier question.
    sid = "left-waiting-2"
    server = _left_waiting(request, tmp_path, sid)
    child = start_chat("--agent", "approver", "--session", sid)
    child.expect_exact(PROMPT)
    child.sendline("and then?")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendintr()
    child.expect_exact("the earlier turn still waits for its decision")
    child.expect_exact(PROMPT)
    # Nothing of "and then?" stays behind it: the next line is the next message, and the
    # earlier turn's question is still the one to answer first.
    child.sendline("once more")
    child.expect_exact("sent before this message, waits for a decision first")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline("y")
    child.expect_exact("tool said: launched rocket")
    child.expect_exact(APPROVE_LAUNCH)
    child.sendline("n")
    child.expect_exact(f"tool said: {REFUSED_RESULT}")
    child.expect_exact(PROMPT)
    leave(child)
    if server is not None:
        with server.client() as c:
            turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        inputs = [(t["input"], t["status"]) for t in turns]
        assert ("once more", "completed") in inputs and ("launch it", "completed") in inputs
        assert all(i != "and then?" or s == "cancelled" for i, s in inputs), inputs
