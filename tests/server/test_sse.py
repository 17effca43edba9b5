"""Turn events over real HTTP: SSE framing, resuming, disconnect policies, approvals, cancel."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server
from tether import Agent
from tether.testing import EchoModel
from tether.tools.approval import REFUSED_RESULT

pytestmark = pytest.mark.slow

SLOW_TEXT = " ".join(f"w{n}" for n in range(40))


@dataclass(frozen=True)
class Frame:
    id: str
    event: str
    data: dict[str, Any]

    @property
    def turn_id(self) -> str:
        return self.id.rpartition(":")[0]

    @property
    def seq(self) -> int:
        return int(self.id.rpartition(":")[2])


def read_frames(response: httpx.Response) -> Iterator[Frame]:
    """Frames of an SSE response, checked to be exactly ``id``, ``event``, ``data`` lines."""
    block: list[str] = []
    for line in response.iter_lines():
        if line:
            block.append(line)
            continue
        lines = [b for b in block if not b.startswith(":")]  # comments are keep-alive pings
        block = []
        if not lines:
            continue
        assert len(lines) == 3, lines
        assert lines[0].startswith("id: ") and lines[1].startswith("event: "), lines
        assert lines[2].startswith("data: "), lines
        yield Frame(lines[0][4:], lines[1][7:], json.loads(lines[2][6:]))
    assert not [b for b in block if not b.startswith(":")], f"unterminated frame {block}"


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


def ended_turn(c: httpx.Client, sid: str, tid: str, within: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        turn: dict[str, Any] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if turn["status"] not in ("queued", "running"):
            return turn
        assert time.monotonic() < deadline, f"turn still {turn['status']}"
        time.sleep(0.05)


def events_url(sid: str, tid: str) -> str:
    return f"/v1/sessions/{sid}/turns/{tid}/events"


def read_all(c: httpx.Client, sid: str, tid: str, **kw: Any) -> list[Frame]:
    with c.stream("GET", events_url(sid, tid), **kw) as r:
        assert r.status_code == 200, r.read()
        return list(read_frames(r))


def read_some(response: httpx.Response, deltas: int) -> list[Frame]:
    """Frames up to and including the ``deltas``-th message.delta (then the caller leaves)."""
    got: list[Frame] = []
    seen = 0
    for frame in read_frames(response):
        got.append(frame)
        if frame.event == "message.delta":
            seen += 1
            if seen == deltas:
                return got
    raise AssertionError(f"the stream ended after {seen} deltas: {got}")


def check_complete(frames: list[Frame], tid: str) -> None:
    """One turn's whole event sequence: consecutive seqs from 1, one terminal event, last."""
    assert {f.turn_id for f in frames} == {tid}
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert frames[0].event == "turn.queued"
    assert [f.event for f in frames].count("turn.ended") == 1
    assert frames[-1].event == "turn.ended"
    assert frames[-1].data["turn_id"] == tid


def text_of(frames: list[Frame]) -> str:
    return "".join(f.data["text"] for f in frames if f.event == "message.delta")


# -- streaming a turn ----------------------------------------------------------------------------
def test_stream_true_answers_with_sse_frames(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "stream": True}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["cache-control"] == "no-store"
            frames = list(read_frames(r))
        tid = frames[0].turn_id
        check_complete(frames, tid)
        assert frames[1].event == "turn.started"
        assert frames[-1].data["status"] == "completed"
        deltas = [f for f in frames if f.event == "message.delta"]
        assert len(deltas) == 40
        turn = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        assert turn["status"] == "completed"
        assert text_of(frames) == turn["output"] == SLOW_TEXT
        # A finished turn's events endpoint replays exactly what was streamed.
        assert read_all(c, sid, tid) == frames


def test_stream_shows_history_to_the_model(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        outputs = []
        for text in ("one", "two"):
            body = {"input": text, "stream": True}
            with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
                frames = list(read_frames(r))
            check_complete(frames, frames[0].turn_id)
            outputs.append(text_of(frames))
        assert outputs == ["saw [] then one", "saw [one] then two"]


# -- re-attaching ---------------------------------------------------------------------------------
def test_resume_with_last_event_id_has_no_gap_and_no_duplicate(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        with c.stream("GET", events_url(sid, tid)) as r:
            assert r.status_code == 200
            first = read_some(r, 3)
        assert first[-1].event == "message.delta"
        headers = {"Last-Event-ID": first[-1].id}
        with c.stream("GET", events_url(sid, tid), headers=headers) as r:
            assert r.status_code == 200
            second = list(read_frames(r))
        assert second, "nothing after the resume point"
        assert second[0].seq == first[-1].seq + 1
        union = first + second
        check_complete(union, tid)
        assert union[-1].data["status"] == "completed"
        assert text_of(union) == SLOW_TEXT
        # The union of both reads is exactly what a full replay gives now.
        assert read_all(c, sid, tid) == union


def test_resume_several_times_while_running(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        got: list[Frame] = []
        for _ in range(3):
            headers = {"Last-Event-ID": got[-1].id} if got else {}
            with c.stream("GET", events_url(sid, tid), headers=headers) as r:
                got += read_some(r, 2)
        headers = {"Last-Event-ID": got[-1].id}
        with c.stream("GET", events_url(sid, tid), headers=headers) as r:
            got += list(read_frames(r))
        check_complete(got, tid)
        assert read_all(c, sid, tid) == got


def test_resume_with_after_query(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        with c.stream("GET", events_url(sid, tid)) as r:
            first = read_some(r, 2)
        rest = read_all(c, sid, tid, params={"after": first[-1].seq})
        check_complete(first + rest, tid)
        full = read_all(c, sid, tid)
        assert first + rest == full
        # On a finished turn, ?after= and Last-Event-ID pick the same tail.
        for n in (0, 1, 5, len(full) - 1):
            assert read_all(c, sid, tid, params={"after": n}) == full[n:]
            if n:
                assert read_all(c, sid, tid, headers={"Last-Event-ID": full[n - 1].id}) == full[n:]
        # From the terminal event itself: nothing more, and 204 stops an EventSource (another
        # turn.ended would have it reconnect for ever).
        assert c.get(events_url(sid, tid), params={"after": len(full)}).status_code == 204
        # Past the terminal event: seqs only grow, so that client has had it; the stream is
        # over. (A client of a process that died mid-turn holds ids below the ending its
        # recovery wrote, which skips past them: test_shutdown's kill -9 test resumes so.)
        for after in (len(full) + 1, len(full) + 5, 999):
            r = c.get(events_url(sid, tid), params={"after": after})
            assert r.status_code == 204, (after, r.text)
            r = c.get(events_url(sid, tid), headers={"Last-Event-ID": f"{tid}:{after}"})
            assert r.status_code == 204, (after, r.text)


def test_finished_turn_replays_everything(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
        assert r.status_code == 200, r.text
        tid = r.json()["id"]
        frames = read_all(c, sid, tid)
        check_complete(frames, tid)
        assert [f.event for f in frames][:2] == ["turn.queued", "turn.started"]
        assert text_of(frames) == "saw [] then hi" == r.json()["output"]
        completed = [f for f in frames if f.event == "message.completed"]
        assert [f.data for f in completed] == [{"text": "saw [] then hi", "complete": True}]


@pytest.mark.parametrize(
    "last_event_id",
    [
        "garbage",
        "{tid}",
        "{tid}:",
        "{tid}:x",
        "{tid}:-1",
        "{tid}:²",
        "{tid}:" + str(2**63),
        "{tid}:" + "9" * 60,
        "other-turn:3",
        ":3",
    ],
)
def test_bad_last_event_id_is_a_400_problem(server: Server, last_event_id: str) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        tid = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"}).json()["id"]
        header = last_event_id.format(tid=tid).encode()
        r = c.get(events_url(sid, tid), headers={b"Last-Event-ID": header})
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("/invalid-input")
        for after in (-1, 2**63, "x"):
            r = c.get(events_url(sid, tid), params={"after": after})
            assert r.status_code == 422
            assert r.headers["content-type"] == "application/problem+json"


def test_events_of_unknown_turn_or_session_are_404(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        for url in (events_url(sid, "t_nope"), events_url("no-such-session", "t_nope")):
            r = c.get(url)
            assert r.status_code == 404
            assert r.headers["content-type"] == "application/problem+json"


# -- client disconnects ---------------------------------------------------------------------------
def test_disconnect_with_on_disconnect_cancel_cancels_and_keeps_partial(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "stream": True, "on_disconnect": "cancel"}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            seen = read_some(r, 3)
        tid = seen[0].turn_id
        turn = ended_turn(c, sid, tid)
        assert (turn["status"], turn["reason"]) == ("cancelled", "client_disconnected")
        assert turn["complete"] is False
        partial = turn["output"]
        assert partial and SLOW_TEXT.startswith(partial) and partial != SLOW_TEXT
        assert partial.startswith(text_of(seen))

        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
        assert [(i["kind"], i["complete"]) for i in items] == [("user", True), ("assistant", False)]
        assert items[1]["content"] == partial
        assert {i["turn_id"] for i in items} == {tid}

        # The replay tells the same story: the partial is marked incomplete, then one ending.
        frames = read_all(c, sid, tid)
        check_complete(frames, tid)
        assert frames[-1].data["status"] == "cancelled"
        assert frames[-2].event == "message.completed"
        assert frames[-2].data == {"text": partial, "complete": False}

        # The session goes on: the next turn completes after the incomplete one.
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "again"})
        assert r.status_code == 200, r.text
        assert r.json()["output"] == SLOW_TEXT
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
        assert [(i["kind"], i["complete"]) for i in items] == [
            ("user", True),
            ("assistant", False),
            ("user", True),
            ("assistant", True),
        ]


def test_disconnect_with_on_disconnect_continue_lets_the_turn_finish(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "stream": True}  # on_disconnect defaults to continue
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            first = read_some(r, 3)
        tid = first[0].turn_id
        # Re-attach while it still runs, right after the last event we saw.
        with c.stream("GET", events_url(sid, tid), headers={"Last-Event-ID": first[-1].id}) as r:
            rest = list(read_frames(r))
        check_complete(first + rest, tid)
        turn = ended_turn(c, sid, tid)
        assert (turn["status"], turn["complete"]) == ("completed", True)
        assert turn["output"] == text_of(first + rest) == SLOW_TEXT
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
        assert [(i["kind"], i["complete"]) for i in items] == [("user", True), ("assistant", True)]


def test_disconnect_from_events_endpoint_never_cancels(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        with c.stream("GET", events_url(sid, tid)) as r:
            read_some(r, 2)
        turn = ended_turn(c, sid, tid)
        assert turn["status"] == "completed"


def test_wait_with_on_disconnect_cancel_cancels_when_the_client_leaves(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        body = {"input": "go", "on_disconnect": "cancel"}
        with pytest.raises(httpx.ReadTimeout), server.client(timeout=0.6) as impatient:
            impatient.post(f"/v1/sessions/{sid}/turns", json=body)
        tid = c.get(f"/v1/sessions/{sid}/turns").json()["data"][0]["id"]
        turn = ended_turn(c, sid, tid)
        assert (turn["status"], turn["reason"]) == ("cancelled", "client_disconnected")


# -- approvals over HTTP ---------------------------------------------------------------------------
def run_approval(server: Server, decision: str) -> tuple[list[Frame], dict[str, Any], str]:
    """Stream a turn that asks for approval; decide it from the stream; read the stream on."""
    with server.client() as c:
        sid = new_session(c, "approver")
        body = {"input": "launch it", "stream": True}
        frames: list[Frame] = []
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            assert r.status_code == 200
            for frame in read_frames(r):
                frames.append(frame)
                if frame.event == "decision.requested":
                    tid, call_id = frame.turn_id, frame.data["call_id"]
                    said = {"call_id": call_id, "decision": decision}
                    d = c.post(f"/v1/sessions/{sid}/turns/{tid}/decisions", json=said)
                    assert d.status_code == 200, d.text
                    first = d.json()
                    assert first["status"] == {"approve": "approved", "deny": "denied"}[decision]
                    # A second decision for the same call: 409, with the first one.
                    again = {"call_id": call_id, "decision": "approve"}
                    d = c.post(f"/v1/sessions/{sid}/turns/{tid}/decisions", json=again)
                    assert d.status_code == 409 and d.json()["type"].endswith("decision-made")
                    assert d.json()["decision"] == first
        tid = frames[0].turn_id
        check_complete(frames, tid)
        turn = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        return frames, turn, sid


def test_approved_tool_runs(server: Server) -> None:
    frames, turn, _ = run_approval(server, "approve")
    kinds = [f.event for f in frames]
    order = ["tool.call", "decision.requested", "turn.awaiting_input", "decision.made"]
    order += ["turn.resumed", "tool.started", "tool.result", "turn.ended"]
    assert [k for k in kinds if k in order] == order
    call = next(f for f in frames if f.event == "tool.call")
    asked = next(f for f in frames if f.event == "decision.requested")
    result = next(f for f in frames if f.event == "tool.result")
    assert asked.data["call_id"] == call.data["call_id"] == result.data["call_id"]
    assert asked.data["kind"] == "approval" and asked.data["payload"]["tool"] == "launch"
    assert asked.data["deadline"] > asked.data["created_at"]
    assert result.data["output"] == "launched rocket"
    assert result.data["error"] is False
    assert (turn["status"], turn["output"]) == ("completed", "tool said: launched rocket")


def test_refused_tool_does_not_run(server: Server) -> None:
    frames, turn, sid = run_approval(server, "deny")
    result = next(f for f in frames if f.event == "tool.result")
    assert result.data["output"] == REFUSED_RESULT
    assert (turn["status"], turn["output"]) == ("completed", f"tool said: {REFUSED_RESULT}")
    assert "launched" not in json.dumps([f.data for f in frames])
    with server.client() as c:
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    results = [i for i in items if i["kind"] == "tool_result"]
    assert [r["content"] for r in results] == [REFUSED_RESULT]


def test_a_client_that_re_attaches_sees_the_pending_decision(server: Server) -> None:
    """Wait=false, then attach to the stream from the start and by Last-Event-ID: the pending
    decision.requested is there; decide it over the plain API; the stream goes on to the end."""
    with server.client() as c:
        sid = new_session(c, "approver")
        tid = c.post(f"/v1/sessions/{sid}/turns", json={"input": "x", "wait": False}).json()["id"]
        pending: list[dict[str, Any]] = []
        for _ in range(200):
            pending = c.get(f"/v1/sessions/{sid}/decisions", params={"status": "pending"}).json()[
                "decisions"
            ]
            if pending:
                break
            time.sleep(0.02)
        [d] = pending
        turn = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        assert turn["status"] == "awaiting_input" and turn["decisions"] == [d]
        url = f"/v1/sessions/{sid}/turns/{tid}/events"
        with c.stream("GET", url) as r:
            seen: list[Frame] = []
            for frame in read_frames(r):
                seen.append(frame)
                if frame.event == "turn.awaiting_input":
                    break
        asked = next(f for f in seen if f.event == "decision.requested")
        assert asked.data["call_id"] == d["call_id"]
        # Re-attach after the request: it comes back only from the next event on.
        with c.stream("GET", url, headers={"Last-Event-ID": asked.id}) as r:
            frames = read_frames(r)
            assert next(frames).event == "turn.awaiting_input"
            decided = c.post(
                f"/v1/sessions/{sid}/turns/{tid}/decisions",
                json={"call_id": d["call_id"], "decision": "approve"},
            )
            assert decided.status_code == 200
            rest = list(frames)
        assert rest[-1].event == "turn.ended" and rest[-1].data["status"] == "completed"
        assert [f.event for f in rest][:2] == ["decision.made", "turn.resumed"]


def test_ask_user_over_sse_with_a_reconnect(server: Server) -> None:
    """The stream of an ask_user turn is cut at the question; the client reconnects with
    Last-Event-ID, answers over the plain API, and reads the answer's result to the end."""
    with server.client() as c:
        sid = new_session(c, "asker")
        body = {"input": "pick one", "stream": True}
        with c.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as r:
            for frame in read_frames(r):
                if frame.event == "decision.requested":
                    asked = frame
                    break  # the client goes away (the turn goes on waiting: on_disconnect)
        assert asked.data["kind"] == "question"
        assert asked.data["payload"] == {
            "question": "Which planet?",
            "choices": ["Mars", "Venus"],
            "agent": "asker",
        }
        tid = asked.turn_id
        url = f"/v1/sessions/{sid}/turns/{tid}/events"
        with c.stream("GET", url, headers={"Last-Event-ID": asked.id}) as r:
            frames = read_frames(r)
            assert next(frames).event == "turn.awaiting_input"
            wrong = c.post(
                f"/v1/sessions/{sid}/turns/{tid}/decisions",
                json={"call_id": asked.data["call_id"], "answer": "Pluto"},
            )
            assert wrong.status_code == 400  # not one of the choices: nothing decided
            right = c.post(
                f"/v1/sessions/{sid}/turns/{tid}/decisions",
                json={"call_id": asked.data["call_id"], "answer": "Venus"},
            )
            assert right.status_code == 200 and right.json()["status"] == "answered"
            rest = list(frames)
        result = next(f for f in rest if f.event == "tool.result")
        assert result.data["output"] == "The user answered: Venus"
        assert rest[-1].event == "turn.ended"
        assert rest[-1].data["output"] == "noted: The user answered: Venus"


def test_a_waiting_request_behind_a_waiting_turn_is_answered_at_once(server: Server) -> None:
    """POST …/turns and /api/chat behind a turn that waits for a human answer 202 (queued,
    behind it, with its decisions) rather than holding the request until the deadline."""
    with server.client(timeout=10) as c:
        sid = new_session(c, "approver")
        first = c.post(f"/v1/sessions/{sid}/turns", json={"input": "one"})
        assert first.status_code == 202 and first.json()["status"] == "awaiting_input"
        [asked] = first.json()["decisions"]
        second = c.post(f"/v1/sessions/{sid}/turns", json={"input": "two"})
        assert second.status_code == 202, second.text
        body = second.json()
        assert (body["status"], body["behind"]) == ("queued", first.json()["id"])
        assert body["decisions"] == [asked]
        chat = c.post("/api/chat", json={"message": "three", "session_id": sid})
        assert chat.status_code == 202, chat.text
        assert (chat.json()["status"], chat.json()["behind"]) == ("queued", first.json()["id"])
        assert chat.json()["decisions"] == [asked]


def test_decisions_for_unknown_calls_and_strangers_are_404(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        tid = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"}).json()["id"]
        url = f"/v1/sessions/{sid}/turns/{tid}/decisions"
        unknown = c.post(url, json={"call_id": "call_unknown", "decision": "approve"})
        assert unknown.status_code == 404
        r = c.post(
            f"/v1/sessions/{sid}/turns/t_nope/decisions",
            json={"call_id": "x", "decision": "approve"},
        )
        assert r.status_code == 404 and r.json() == unknown.json()
        assert c.post(url, json={"call_id": "", "decision": "approve"}).status_code == 422
        assert c.post(url, json={"call_id": "c", "decision": "maybe"}).status_code == 422
        assert c.post(url, json={"call_id": "c"}).status_code == 422  # says nothing
        assert c.get(f"/v1/sessions/{sid}/decisions").json() == {"decisions": []}


# -- cancel endpoint ------------------------------------------------------------------------------
def test_cancel_a_running_turn(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        tid = start_turn(c, sid, "go")
        with c.stream("GET", events_url(sid, tid)) as r:
            read_some(r, 2)  # it is running and has said something
        r = c.post(f"/v1/sessions/{sid}/turns/{tid}/cancel")
        assert r.status_code == 200
        turn = r.json()
        assert (turn["id"], turn["status"], turn["reason"]) == (tid, "cancelled", "cancelled")
        assert turn["complete"] is False
        assert turn["output"] and SLOW_TEXT.startswith(turn["output"])
        assert turn["output"] != SLOW_TEXT
        # Cancelling again answers with the ended turn, unchanged.
        again = c.post(f"/v1/sessions/{sid}/turns/{tid}/cancel")
        assert again.status_code == 200
        assert again.json() == turn
        frames = read_all(c, sid, tid)
        check_complete(frames, tid)
        assert frames[-1].data["status"] == "cancelled"


def test_cancel_a_queued_turn(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "slow")
        first = start_turn(c, sid, "one")
        second = start_turn(c, sid, "two")
        r = c.post(f"/v1/sessions/{sid}/turns/{second}/cancel")
        assert r.status_code == 200
        assert (r.json()["status"], r.json()["reason"]) == ("cancelled", "cancelled")
        assert ended_turn(c, sid, first)["status"] == "completed"
        frames = read_all(c, sid, second)
        check_complete(frames, second)
        assert [f.event for f in frames] == ["turn.queued", "turn.ended"]
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
        assert {i["turn_id"] for i in items} == {first}


def test_cancel_a_finished_turn_returns_it_as_is(server: Server) -> None:
    with server.client() as c:
        sid = new_session(c, "echo")
        done = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"}).json()
        r = c.post(f"/v1/sessions/{sid}/turns/{done['id']}/cancel")
        assert r.status_code == 200
        assert r.json() == done
        assert c.post(f"/v1/sessions/{sid}/turns/t_nope/cancel").status_code == 404


async def test_a_stream_whose_session_is_deleted_under_it_ends_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Followed from another process, a turn's session may be deleted (its turns ended first)
    before the follower reads the ending: the stream ends cleanly (a client coming back gets
    the 404), not cut mid-chunk by an exception in the ASGI app."""
    from tether.errors import TurnNotFound
    from tether.server.app import create_app
    from tether.server.settings import Settings

    app = create_app(Settings(data_dir=tmp_path), agents=[Agent(name="a", model=EchoModel())])
    runtime = app.state.tether.runtime
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            made = await c.post("/v1/sessions/gone/turns", json={"input": "hi"})
            assert made.status_code == 404  # no such session yet: make it
            assert (await c.post("/v1/sessions", json={"session_id": "gone"})).status_code == 201
            turn = (await c.post("/v1/sessions/gone/turns", json={"input": "hi"})).json()
            real = runtime.scheduler.events

            async def deleted_meanwhile(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async for event in real(*args, **kwargs):
                    if event.type == "turn.ended":
                        raise TurnNotFound("turn not found")  # as a follower elsewhere finds
                    yield event

            runtime.scheduler.events = deleted_meanwhile
            with caplog.at_level(logging.ERROR):
                r = await c.get(f"/v1/sessions/gone/turns/{turn['id']}/events")
    assert r.status_code == 200
    assert "event: turn.started" in r.text and "turn.ended" not in r.text
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
