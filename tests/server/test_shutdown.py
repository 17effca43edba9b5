"""SIGTERM drains running turns, records an honest ending, and a restart finds it consistent."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.slow

SLOW_TEXT = " ".join(f"w{n}" for n in range(40))  # the `slow` agent's reply: 40 words, ~2 s
MARGIN = 5.0  # seconds beyond the drain timeout a stopping server may take

Launch = Callable[..., Server]


@pytest.fixture
def launch() -> Iterator[Launch]:
    """Start ``tether serve`` on a given data directory (so a test can restart on it)."""
    started: list[Server] = []

    def go(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Server:
        srv = start_server(data_dir, *args, env=env)
        started.append(srv)
        return srv

    yield go
    for srv in started:
        srv.stop(signal.SIGKILL)


def terminate(srv: Server, within: float) -> tuple[int, float]:
    """SIGTERM; the exit code and how long the process took to exit."""
    began = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        code = srv.proc.wait(timeout=within + 10)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        raise AssertionError(
            f"still running {within + 10}s after SIGTERM:\n{srv.output()}"
        ) from None
    return code, time.monotonic() - began


def new_session(c: httpx.Client, agent: str) -> str:
    r = c.post("/v1/sessions", json={"agent": agent})
    assert r.status_code == 201, r.text
    sid: str = r.json()["session_id"]
    return sid


def start_turn(c: httpx.Client, sid: str, text: str) -> str:
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": text, "wait": False})
    assert r.status_code == 202, r.text
    tid: str = r.json()["id"]
    return tid


def turn_of(c: httpx.Client, sid: str, tid: str) -> dict[str, Any]:
    r = c.get(f"/v1/sessions/{sid}/turns/{tid}")
    assert r.status_code == 200, r.text
    turn: dict[str, Any] = r.json()
    return turn


def wait_for(c: httpx.Client, sid: str, tid: str, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        turn = turn_of(c, sid, tid)
        if turn["status"] in statuses:
            return turn
        assert time.monotonic() < deadline, f"turn is {turn['status']}, not one of {statuses}"
        time.sleep(0.05)


def wait_for_output(c: httpx.Client, sid: str, tid: str, deltas: int) -> None:
    """Until the running turn has streamed ``deltas`` pieces of text."""
    seen = 0
    with c.stream("GET", f"/v1/sessions/{sid}/turns/{tid}/events") as r:
        for line in r.iter_lines():
            if line == "event: message.delta":
                seen += 1
                if seen == deltas:
                    return
    raise AssertionError(f"the turn ended after {seen} deltas")


def items_of(c: httpx.Client, sid: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    return data


def check_consistent_after_restart(srv: Server, sid: str, tid: str) -> dict[str, Any]:
    """Nothing is left running, the history is readable, and the session takes a new turn."""
    with srv.client() as c:
        turn = turn_of(c, sid, tid)
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        assert [t["status"] for t in turns if t["status"] in ("queued", "running")] == []
        session = c.get(f"/v1/sessions/{sid}").json()
        assert session["status"] == "idle"
        events = c.get(f"/v1/sessions/{sid}/turns/{tid}/events").text
        ended = [b for b in events.split("\n\n") if "event: turn.ended" in b]
        assert len(ended) == 1
        data = json.loads(ended[0].split("data: ", 1)[1])
        assert (data["status"], data["reason"]) == (turn["status"], turn["reason"])
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "after the restart"})
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["output"]) == ("completed", SLOW_TEXT)
        return turn


def test_sigterm_lets_a_running_turn_finish_within_the_drain(
    launch: Launch, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    srv = launch(data)  # the default drain timeout, 10 s, is ample for a ~2 s turn
    with srv.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        wait_for_output(c, sid, tid, 3)
    code, took = terminate(srv, within=10)
    assert code == 0, srv.output()
    assert took < 10 + MARGIN
    assert "Traceback" not in srv.output()

    again = launch(data)
    turn = check_consistent_after_restart(again, sid, tid)
    assert (turn["status"], turn["reason"], turn["complete"]) == ("completed", "answered", True)
    assert turn["output"] == SLOW_TEXT
    with again.client() as c:
        items = items_of(c, sid)
    assert [(i["kind"], i["complete"], i["turn_id"]) for i in items[:2]] == [
        ("user", True, tid),
        ("assistant", True, tid),
    ]


def test_sigterm_cancels_a_turn_that_outlasts_the_drain(launch: Launch, tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = launch(data, "--drain-timeout", "0.3")
    with srv.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        wait_for_output(c, sid, tid, 3)
    code, took = terminate(srv, within=0.3)
    assert code == 0, srv.output()
    assert took < 0.3 + MARGIN
    assert "Traceback" not in srv.output()

    again = launch(data)
    turn = check_consistent_after_restart(again, sid, tid)
    assert (turn["status"], turn["reason"], turn["complete"]) == ("cancelled", "shutdown", False)
    partial = turn["output"]
    assert partial and SLOW_TEXT.startswith(partial) and partial != SLOW_TEXT
    with again.client() as c:
        items = items_of(c, sid)
    assert [(i["kind"], i["complete"], i["content"]) for i in items[:2]] == [
        ("user", True, "go"),
        ("assistant", False, partial),
    ]


def test_sigterm_ends_an_open_stream_with_the_terminal_event(
    launch: Launch, tmp_path: Path
) -> None:
    """A client streaming the turn when the server stops hears how it ended, then EOF."""
    srv = launch(tmp_path / "data", env={"TETHER_DRAIN_TIMEOUT": "0.3"})
    events: list[str] = []
    last_data = ""
    with srv.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "stream": True}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            began = 0.0
            for line in r.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])
                    if events.count("message.delta") == 3:
                        began = time.monotonic()
                        srv.proc.send_signal(signal.SIGTERM)
                elif line.startswith("data: "):
                    last_data = line[6:]
            took = time.monotonic() - began
    assert began, events
    assert events.count("turn.ended") == 1 and events[-1] == "turn.ended", events
    ending = json.loads(last_data)
    assert (ending["status"], ending["reason"]) == ("cancelled", "shutdown")
    assert took < 0.3 + MARGIN
    assert srv.proc.wait(timeout=MARGIN) == 0, srv.output()


def test_sigterm_answers_a_waiting_request_with_the_ending(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path / "data", "--drain-timeout", "0.3")
    with srv.client() as c:
        sid = new_session(c, "slow")

        def signal_once_running() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with srv.client() as other:
                    turns = other.get(f"/v1/sessions/{sid}/turns").json()["data"]
                if turns and turns[0]["status"] == "running":
                    srv.proc.send_signal(signal.SIGTERM)
                    return
                time.sleep(0.05)

        signaller = threading.Thread(target=signal_once_running)
        signaller.start()
        try:
            r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "go"})
        finally:
            signaller.join()
    # Not a success: the body says how the turn ended, and why.
    assert r.status_code >= 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    turn = r.json()["turn"]
    assert (turn["status"], turn["reason"], turn["complete"]) == ("cancelled", "shutdown", False)
    assert srv.proc.wait(timeout=MARGIN) == 0, srv.output()


def test_stream_of_a_queued_turn_ends_cleanly_and_the_turn_survives(
    launch: Launch, tmp_path: Path
) -> None:
    """The server will not run it any more; the stream ends (no terminal event, no cut-off)
    so the client can re-attach, and on_disconnect=cancel does not treat that as leaving."""
    data = tmp_path / "data"
    srv = launch(data, "--drain-timeout", "0.3")
    events: list[str] = []
    with srv.client() as c:
        sid = new_session(c, "slow")
        first = start_turn(c, sid, "one")
        wait_for_output(c, sid, first, 2)
        body = {"input": "two", "stream": True, "on_disconnect": "cancel"}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])
                    began = time.monotonic()
                    srv.proc.send_signal(signal.SIGTERM)
                elif line.startswith("id: "):
                    second = line[4:].rpartition(":")[0]
        took = time.monotonic() - began
    assert events == ["turn.queued"]
    assert took < 0.3 + MARGIN
    assert srv.proc.wait(timeout=MARGIN) == 0, srv.output()

    again = launch(data)
    with again.client() as c:
        assert turn_of(c, sid, first)["reason"] == "shutdown"
        done = wait_for(c, sid, second, {"completed", "cancelled", "failed"})
        assert (done["status"], done["output"]) == ("completed", SLOW_TEXT)


@pytest.mark.parametrize("door", ["turns", "api-chat", "openai"])
def test_a_request_waiting_on_a_queued_turn_gets_a_503_at_shutdown(
    launch: Launch, tmp_path: Path, door: str
) -> None:
    """The server will not run a turn queued behind the one it drains: a caller waiting for it
    is told so (503 problem+json, as the README says), not cut off with a plain-text 500 once
    the server's patience runs out. The turn stays queued, and runs after a restart."""
    data = tmp_path / "data"
    srv = launch(data, "--drain-timeout", "0.3")
    answers: list[httpx.Response] = []
    with srv.client() as c:
        sid = new_session(c, "slow")
        first = start_turn(c, sid, "one")
        wait_for_output(c, sid, first, 2)

        def ask() -> None:
            with srv.client() as other:
                if door == "turns":
                    r = other.post(f"/v1/sessions/{sid}/turns", json={"input": "two"})
                elif door == "api-chat":
                    r = other.post("/api/chat", json={"message": "two", "session_id": sid})
                else:
                    body = {"model": "slow", "messages": [{"role": "user", "content": "two"}]}
                    r = other.post(
                        "/v1/chat/completions", json=body, headers={"X-Tether-Session": sid}
                    )
                answers.append(r)

        waiting = threading.Thread(target=ask)
        waiting.start()
        deadline = time.monotonic() + 10
        while len(c.get(f"/v1/sessions/{sid}/turns").json()["data"]) < 2:
            assert time.monotonic() < deadline, "the second turn was never queued"
            time.sleep(0.05)
        code, took = terminate(srv, within=0.3)
        waiting.join(timeout=MARGIN)
    assert code == 0, srv.output()
    assert took < 0.3 + MARGIN
    (r,) = answers
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/")  # problem+json, or OpenAI's
    assert "shutting down" in r.text
    assert "Task exception was never retrieved" not in srv.output()

    again = launch(data)
    with again.client() as c:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        second = turns[1]["id"]
        done = wait_for(c, sid, second, {"completed", "cancelled", "failed"})
        assert (done["status"], done["output"]) == ("completed", SLOW_TEXT)


def test_queued_turns_survive_a_shutdown_and_run_after_restart(
    launch: Launch, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    srv = launch(data, "--drain-timeout", "0.3")
    with srv.client() as c:
        sid = new_session(c, "slow")
        first = start_turn(c, sid, "one")
        second = start_turn(c, sid, "two")
        wait_for_output(c, sid, first, 2)
    code, _ = terminate(srv, within=0.3)
    assert code == 0, srv.output()

    again = launch(data)
    with again.client() as c:
        assert (turn_of(c, sid, first)["status"], turn_of(c, sid, first)["reason"]) == (
            "cancelled",
            "shutdown",
        )
        done = wait_for(c, sid, second, {"completed", "cancelled", "failed"})
        assert (done["status"], done["output"]) == ("completed", SLOW_TEXT)
        items = items_of(c, sid)
        assert [(i["kind"], i["complete"], i["turn_id"]) for i in items] == [
            ("user", True, first),
            ("assistant", False, first),
            ("user", True, second),
            ("assistant", True, second),
        ]


def test_the_listener_closes_at_once_when_draining_begins(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path / "data")
    with srv.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        wait_for_output(c, sid, tid, 2)
        srv.proc.send_signal(signal.SIGTERM)
        # The listening socket closes at once: new connections are refused, not queued. (One
        # that raced into the accept queue just before it closed is reset: not served either.)
        deadline = time.monotonic() + 5
        while True:
            try:
                with srv.client(timeout=2) as fresh:
                    fresh.get("/healthz")
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                break
            assert time.monotonic() < deadline, "still accepting connections"
            time.sleep(0.05)
    assert srv.proc.wait(timeout=10 + MARGIN) == 0, srv.output()


def test_after_kill_9_a_resumed_stream_hears_the_ending(launch: Launch, tmp_path: Path) -> None:
    """Events are streamed as they come and stored a moment later (a flush a quarter second):
    a process killed between the two has shown followers seqs the store never got. The
    ending its successor writes comes after all of them; it took the first free seq, one a
    follower had seen already, so resuming after the last one it saw (the console does
    nothing else) never heard the turn end."""
    data = tmp_path / "data"
    srv = launch(data)
    seen: list[str] = []
    with srv.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "stream": True}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("id: "):
                    seen.append(line[4:])
                if len(seen) == 12:
                    srv.stop(signal.SIGKILL)
                    break
    tid, last = seen[-1].rsplit(":", 1)
    again = launch(data)
    with again.client() as c:
        deadline = time.monotonic() + 30
        turn: dict[str, Any] = {}
        while time.monotonic() < deadline:
            turn = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
            if turn["status"] not in ("queued", "running"):
                break
            time.sleep(0.1)
        assert (turn["status"], turn["reason"]) == ("failed", "owner_lost"), turn
        headers = {"Last-Event-ID": seen[-1]}
        r = c.get(f"/v1/sessions/{sid}/turns/{tid}/events", headers=headers)
        assert r.status_code == 200, r.text
        ids = [line[4:] for line in r.text.splitlines() if line.startswith("id: ")]
        kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds == ["turn.ended"], r.text
    assert int(ids[0].rsplit(":", 1)[1]) > int(last), (ids, seen)


def test_deleting_a_session_through_another_process_ends_its_stream_with_the_ending(
    launch: Launch, tmp_path: Path
) -> None:
    """Two processes on one SQLite file: the turn runs on A, is followed and deleted through B.
    B's follower reads the store; the rows used to go before it read the ending, and the stream
    ended without one (or cut short, with an error in the log)."""
    data = tmp_path / "data"
    a, b = launch(data), launch(data)
    with a.client() as ca, b.client() as cb:
        sid = new_session(ca, "slow")
        tid = ca.post(f"/v1/sessions/{sid}/turns", json={"input": "go", "wait": False}).json()["id"]
        kinds: list[str] = []
        last = ""
        with cb.stream("GET", f"/v1/sessions/{sid}/turns/{tid}/events") as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                    if kinds.count("message.delta") == 3:
                        deleter = threading.Thread(
                            target=lambda: cb.delete(f"/v1/sessions/{sid}"), daemon=True
                        )
                        deleter.start()
                elif line.startswith("data: "):
                    last = line[6:]
        deleter.join(10)
        assert cb.get(f"/v1/sessions/{sid}").status_code == 404
    assert kinds[-1] == "turn.ended", kinds
    ending = json.loads(last)
    assert (ending["status"], ending["reason"]) == ("cancelled", "session_deleted")
    for srv in (a, b):
        assert "Traceback" not in srv.output() and "ERROR" not in srv.output()
