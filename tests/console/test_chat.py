"""The console's sign-in, sessions and chat, in Chromium, against a server with API keys.

The model is the fake OpenAI server: each test scripts what it says (text, tool calls, errors)
and how slowly it streams, and checks what the console shows of the turn tether made of it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from tests.console.conftest import TIMEOUT_MS, Console, Shoot
from tests.console.proxy import DroppingProxy
from tether.testing.fake_openai import FakeError, FakeOpenAIServer, FakeToolCall

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=TIMEOUT_MS)

LONG = " ".join(f"w{n}" for n in range(40))
"""A reply of 40 words: with a chunk delay it streams for seconds, word by word."""


def new_session(console: Console, user: str, agent: str = "assistant") -> str:
    sid = f"c-{uuid.uuid4().hex[:10]}"
    with console.api(user) as c:
        r = c.post("/v1/sessions", json={"session_id": sid, "agent": agent})
        assert r.status_code == 201, r.text
    return sid


def open_chat(console: Console, user: str, sid: str | None = None) -> tuple[Page, str]:
    sid = sid or new_session(console, user)
    page = console.page(user)
    page.goto(f"{console.url}/#/sessions/{sid}")
    expect(page.get_by_role("heading", name=sid)).to_be_visible()
    return page, sid


def send(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def turn(page: Page, n: int) -> Locator:
    return page.get_by_role("article", name=f"Turn {n}")


def reply_text(t: Locator) -> str:
    return " ".join(t.locator(".text").all_inner_texts())


# -- sign-in ---------------------------------------------------------------------------------
def test_sign_in_with_a_key_refuses_a_wrong_one_and_signs_out(console: Console) -> None:
    page = console.page()
    page.goto(console.url + "/")
    form = page.get_by_role("form", name="Sign in")
    expect(form).to_be_visible()
    key = page.get_by_label("API key")

    key.fill("tk_wrong_not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("refused this API key (401")
    # With the server's reason (it was dropped).
    expect(page.get_by_role("alert")).to_contain_text("invalid or revoked API key.")

    key.fill(console.keys["alice"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"^key tk_"))).to_be_visible()
    # Kept for the tab: a reload stays signed in.
    page.reload()
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()

    page.get_by_role("button", name="Sign out").click()
    expect(form).to_be_visible()
    expect(page.get_by_role("alert")).to_have_text("Signed out.")
    assert page.evaluate("sessionStorage.getItem('tether.apiKey')") is None


# -- sessions --------------------------------------------------------------------------------
def test_create_a_session_rename_it_and_find_it_by_id(console: Console) -> None:
    page = console.page("alice")
    page.goto(console.url + "/")
    form = page.get_by_role("form", name="New session")
    sid = f"made-{uuid.uuid4().hex[:8]}"
    form.get_by_label("Agent").select_option("helper")
    form.get_by_label("Session id (optional)").fill(sid)
    form.get_by_role("button", name="Create session").click()
    expect(page.get_by_role("heading", name=sid)).to_be_visible()
    expect(page.get_by_text("agents: helper")).to_be_visible()

    page.get_by_role("button", name="Rename").click()
    page.get_by_role("textbox", name="Title").fill("Trip planning")
    page.get_by_role("button", name="Save title").click()
    expect(page.get_by_role("heading", name="Trip planning")).to_be_visible()
    with console.api("alice") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["metadata"] == {"title": "Trip planning"}

    page.get_by_role("link", name="Sessions", exact=True).first.click()
    other = new_session(console, "alice")
    page.reload()
    page.get_by_role("searchbox", name="Search sessions by id").fill(sid[:10])
    sessions = page.get_by_role("list", name="Sessions")
    expect(sessions.get_by_role("link", name=re.compile("Trip planning"))).to_be_visible()
    expect(sessions.get_by_role("link", name=other)).to_have_count(0)


def test_delete_and_clear_ask_first(console: Console, fake: FakeOpenAIServer) -> None:
    page, sid = open_chat(console, "alice")
    send(page, "hello")
    expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")

    page.get_by_role("button", name="Clear history").click()
    dialog = page.get_by_role("dialog", name="Clear the history?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(turn(page, 1)).to_be_visible()
    page.get_by_role("button", name="Clear history").click()
    dialog.get_by_role("button", name="Clear history").click()
    expect(turn(page, 1)).to_have_count(0)
    with console.api("alice") as c:
        assert c.get(f"/v1/sessions/{sid}/items").json()["data"] == []

    page.get_by_role("button", name="Delete session").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete session").click()
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
    with console.api("alice") as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 404


# -- streaming -------------------------------------------------------------------------------
def test_a_streamed_reply_arrives_in_pieces(console: Console, fake: FakeOpenAIServer) -> None:
    page, _ = open_chat(console, "alice")
    fake.chunk_delay_ms = 40
    fake.script(LONG)
    # Record every text the reply showed, as the page drew it.
    page.evaluate(
        """() => {
          window.seen = [];
          new MutationObserver(() => {
            const t = document.querySelector('article.turn .text');
            if (t && window.seen.at(-1) !== t.textContent) window.seen.push(t.textContent);
          }).observe(document.querySelector('.transcript'),
                     {subtree: true, childList: true, characterData: true});
        }"""
    )
    send(page, "Count for me")
    expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")
    assert reply_text(turn(page, 1)) == LONG
    seen: list[str] = page.evaluate("window.seen")
    assert len(seen) >= 5, seen  # drawn piece by piece, not at the end
    assert all(LONG.startswith(s) for s in seen), seen
    expect(turn(page, 1).locator(".incomplete-note")).to_have_count(0)


def test_a_reload_mid_stream_shows_the_reply_once(console: Console, fake: FakeOpenAIServer) -> None:
    page, _ = open_chat(console, "alice")
    fake.chunk_delay_ms = 60
    fake.script(LONG)
    send(page, "Count slowly")
    expect(turn(page, 1).locator(".text")).to_contain_text("w3")
    page.reload()
    # The turn is replayed from its stored events, then followed live: the whole reply, once.
    expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")
    assert reply_text(turn(page, 1)) == LONG
    assert page.locator("article.turn").count() == 1


def test_a_dropped_stream_resumes_from_last_event_id(
    console: Console, fake: FakeOpenAIServer
) -> None:
    sid = new_session(console, "alice")
    port = int(console.url.rsplit(":", 1)[1])
    with DroppingProxy(port) as proxy:
        page = console.page("alice")
        resumed: list[str] = []
        page.on(
            "request",
            lambda r: (
                resumed.append(r.headers["last-event-id"]) if "last-event-id" in r.headers else None
            ),
        )
        page.goto(f"{proxy.url}/#/sessions/{sid}")
        fake.chunk_delay_ms = 60
        fake.script(LONG)
        send(page, "Count while I drop")
        expect(turn(page, 1).locator(".text")).to_contain_text("w3")
        proxy.drop()  # the laptop lid closes: the open stream is cut
        expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")
        assert reply_text(turn(page, 1)) == LONG  # nothing lost, nothing twice
    assert resumed and all(re.fullmatch(r"t_[\w-]+:\d+", r) for r in resumed), resumed


def test_stop_mid_reply_cancels_and_marks_the_partial_reply(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, sid = open_chat(console, "alice")
    fake.chunk_delay_ms = 80
    fake.script(LONG)
    send(page, "Talk for a long time")
    first = turn(page, 1)
    expect(first.locator(".text")).to_contain_text("w2")
    page.get_by_role("button", name="Stop").click()
    expect(first.locator(".outcome .status")).to_have_text("cancelled")
    expect(first.locator(".outcome")).to_contain_text("reason: cancelled")
    expect(first.get_by_text("incomplete: the reply was cut off")).to_be_visible()
    partial = reply_text(first)
    assert partial and LONG.startswith(partial) and partial != LONG
    with console.api("alice") as c:
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [i["complete"] for i in items if i["kind"] == "assistant"] == [False]

    # Esc stops too.
    fake.script(LONG)
    send(page, "And again")
    expect(turn(page, 2).locator(".text")).to_contain_text("w2")
    page.keyboard.press("Escape")
    expect(turn(page, 2).locator(".outcome .status")).to_have_text("cancelled")


def test_a_message_sent_while_busy_follows_the_chosen_policy(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, _ = open_chat(console, "alice")
    fake.chunk_delay_ms = 60
    fake.script(LONG, LONG, "third answer")
    send(page, "first")
    expect(turn(page, 1).locator(".text")).to_contain_text("w2")

    page.get_by_label("If a turn is under way").select_option("reject")
    send(page, "refused one")
    expect(page.get_by_role("form", name="Send a message").get_by_role("alert")).to_contain_text(
        "the session is busy"
    )
    expect(page.get_by_role("textbox", name="Message")).to_have_value("refused one")

    page.get_by_label("If a turn is under way").select_option("interrupt")
    send(page, "now this")
    expect(turn(page, 1).locator(".outcome .status")).to_have_text("interrupted")
    expect(turn(page, 1).get_by_text("incomplete: the reply was cut off")).to_be_visible()
    expect(turn(page, 2).locator(".text")).to_contain_text("w2")

    page.get_by_label("If a turn is under way").select_option("rollback")
    send(page, "no, this")
    expect(turn(page, 2).locator(".outcome .status")).to_have_text("rolled back")
    expect(turn(page, 2).locator(".outcome")).to_contain_text("its messages were removed")
    expect(turn(page, 3).locator(".outcome")).to_contain_text("completed")
    expect(turn(page, 3).locator(".text")).to_have_text("third answer")


def test_shift_enter_makes_a_new_line(console: Console, fake: FakeOpenAIServer) -> None:
    page, _ = open_chat(console, "alice")
    box = page.get_by_role("textbox", name="Message")
    box.fill("line one")
    box.press("Shift+Enter")
    box.press_sequentially("line two")
    expect(box).to_have_value("line one\nline two")
    assert page.locator("article.turn").count() == 0
    box.press("Enter")
    expect(turn(page, 1).locator(".bubble.user")).to_contain_text("line one\nline two")
    expect(turn(page, 1).locator(".text")).to_have_text("echo: line one\nline two")


# -- decisions -------------------------------------------------------------------------------
def test_approve_a_tool_then_see_its_result_and_the_answer(
    console: Console, fake: FakeOpenAIServer, shoot: Shoot
) -> None:
    page, sid = open_chat(console, "alice")
    fake.script(FakeToolCall("launch", '{"target": "rocket"}'), "The rocket is up.")
    send(page, "Launch the rocket")
    card = page.get_by_role("group", name="Approval for tool launch")
    expect(card).to_contain_text('"target": "rocket"')
    expect(turn(page, 1).locator(".outcome")).to_contain_text("waiting for your decision")
    shoot(page, "approval")
    # The session waits for a human: its header and the sessions list say so.
    expect(page.locator(".session-head .status")).to_have_text("awaiting input")
    listing = console.page("alice")
    listing.goto(console.url + "/")
    entry = listing.get_by_role("listitem").filter(has_text=sid)
    expect(entry.locator(".status")).to_have_text("awaiting input")
    expect(entry).to_contain_text("turns1")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_contain_text("Approved (by alice)")
    expect(turn(page, 1).locator(".text")).to_have_text("The rocket is up.")
    tool = turn(page, 1).locator("details.tool")
    expect(tool).to_contain_text("→ done")
    tool.locator("summary").click()
    expect(tool.locator(".tool-result")).to_have_text("launched rocket")
    expect(card.get_by_role("button", name="Approve")).to_be_disabled()


def test_deny_a_tool_and_the_model_reads_the_refusal(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, _ = open_chat(console, "alice")
    fake.script(FakeToolCall("launch", '{"target": "moon"}'), "Understood, no launch.")
    send(page, "Launch to the moon")
    card = page.get_by_role("group", name="Approval for tool launch")
    card.get_by_role("button", name="Deny").click()
    expect(card).to_contain_text("Denied")
    expect(turn(page, 1).locator(".text")).to_have_text("Understood, no launch.")
    tool = turn(page, 1).locator("details.tool")
    expect(tool).to_contain_text("→ error")
    tool.locator("summary").click()
    expect(tool.locator(".tool-result")).to_contain_text("refused")
    # What the model was told.
    last = fake.chat_requests[-1]["messages"][-1]
    assert last["role"] == "tool" and "refused" in last["content"]


def test_a_decision_made_elsewhere_updates_the_card(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, sid = open_chat(console, "alice")
    fake.script(FakeToolCall("launch", '{"target": "probe"}'), "Probe away.")
    send(page, "Launch a probe")
    card = page.get_by_role("group", name="Approval for tool launch")
    expect(card.get_by_role("button", name="Always")).to_be_enabled()
    with console.api("alice") as c:  # another tab, the SDK, a script…
        pending = c.get(f"/v1/sessions/{sid}/decisions", params={"status": "pending"}).json()
        d = pending["decisions"][0]
        r = c.post(
            f"/v1/sessions/{sid}/turns/{d['turn_id']}/decisions",
            json={"call_id": d["call_id"], "decision": "always"},
        )
        assert r.status_code == 200, r.text
    expect(card).to_contain_text("Approved for the rest of the session (by alice)")
    expect(card.get_by_role("button", name="Approve")).to_be_disabled()
    expect(turn(page, 1).locator(".text")).to_have_text("Probe away.")


def test_a_turn_sent_from_elsewhere_shows_up(console: Console, fake: FakeOpenAIServer) -> None:
    page, sid = open_chat(console, "alice")
    send(page, "from the console")
    expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")
    with console.api("alice") as c:  # tether chat, the SDK, another tab…
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "from a script"})
        assert r.status_code == 200, r.text
    expect(turn(page, 2).locator(".bubble.user")).to_contain_text("from a script")
    expect(turn(page, 2).locator(".text")).to_have_text("echo: from a script")
    expect(page.locator("article.turn")).to_have_count(2)


def hold_history_until_sent(page: Page, sid: str, meanwhile: Callable[[], None] = print) -> None:
    """The page's first read of the session's turns answers only once the page has sent a
    message and the answer to that has reached it (``meanwhile`` runs in between)."""
    held: list[Route] = []

    def turns(route: Route) -> None:
        if route.request.method == "GET" and not held and "cursor=" not in route.request.url:
            held.append(route)
            return
        if route.request.method == "POST":
            route.fulfill(response=route.fetch())  # the page learns of its turn first...
            meanwhile()
            while held:
                held.pop().continue_()  # ...then the history, which holds it already
            return
        route.continue_()

    page.route(f"**/v1/sessions/{sid}/turns*", turns)


def open_holding_history(console: Console, sid: str, meanwhile: Callable[[], None] = print) -> Page:
    page = console.page("alice")
    hold_history_until_sent(page, sid, meanwhile)
    with page.expect_request(lambda r: r.method == "GET" and "/turns?" in r.url):
        page.goto(f"{console.url}/#/sessions/{sid}")
    expect(page.get_by_role("heading", name=sid)).to_be_visible()
    return page


def turn_labels(page: Page) -> list[str | None]:
    return [a.get_attribute("aria-label") for a in page.locator("article.turn").all()]


def test_a_message_sent_while_the_history_loads_is_drawn_once_in_its_place(
    console: Console, fake: FakeOpenAIServer
) -> None:
    sid = new_session(console, "alice")
    with console.api("alice") as c:
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "an earlier message"})
        assert r.status_code == 200, r.text

    def another_tab() -> None:  # sends too, after this page's message and before the history
        with console.api("alice") as c:
            r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "from another tab"})
            assert r.status_code == 200, r.text

    page = open_holding_history(console, sid, another_tab)
    send(page, "typed before the history came")
    expect(turn(page, 2).locator(".text")).to_have_text("echo: typed before the history came")
    expect(turn(page, 1).locator(".text")).to_have_text("echo: an earlier message")
    expect(turn(page, 3).locator(".text")).to_have_text("echo: from another tab")
    expect(page.locator("article.turn")).to_have_count(3)
    assert turn_labels(page) == ["Turn 1", "Turn 2", "Turn 3"]


def test_a_running_turn_of_the_history_streams_ahead_of_one_sent_while_it_loaded(
    console: Console, fake: FakeOpenAIServer
) -> None:
    sid = new_session(console, "alice")
    fake.chunk_delay_ms = 100
    fake.script(LONG, "second answer")
    with console.api("alice") as c:
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "talk long", "wait": False})
        assert r.status_code == 202, r.text
    page = open_holding_history(console, sid)
    send(page, "queued behind it")
    expect(page.locator("article.turn")).to_have_count(2)
    # Turn 1 streams for ~4 s: its words show while it runs, not all at once when it ends.
    expect(turn(page, 1).locator(".text")).to_contain_text("w3")
    expect(turn(page, 1).locator(".outcome")).not_to_contain_text("completed")
    expect(turn(page, 2).locator(".text")).to_have_text("second answer")
    assert reply_text(turn(page, 1)) == LONG


def test_ask_user_questions_are_answered_by_choice_and_by_text(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, _ = open_chat(console, "alice")
    fake.script(
        FakeToolCall("ask_user", '{"question": "Which planet?", "choices": ["Mars", "Venus"]}'),
        "Mars it is.",
    )
    send(page, "Pick a planet for me")
    card = page.get_by_role("group", name="Question")
    expect(card.get_by_role("heading")).to_have_text("Which planet?")
    card.get_by_role("button", name="Mars").click()
    expect(card).to_contain_text("Answered: Mars")
    expect(turn(page, 1).locator(".text")).to_have_text("Mars it is.")
    assert fake.chat_requests[-1]["messages"][-1]["content"].endswith("Mars")

    fake.script(FakeToolCall("ask_user", '{"question": "What is your name?"}'), "Hello, Ada.")
    send(page, "Greet me")
    card = turn(page, 2).get_by_role("group", name="Question")
    card.get_by_role("textbox", name="Your answer").fill("Ada")
    card.get_by_role("button", name="Send answer").click()
    expect(card).to_contain_text("Answered: Ada")
    expect(turn(page, 2).locator(".text")).to_have_text("Hello, Ada.")


# -- outcomes, memory, handoffs ---------------------------------------------------------------
def test_a_failing_model_shows_the_failure_and_its_reason(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, _ = open_chat(console, "alice")
    fake.script(FakeError(500, "upstream exploded"))
    send(page, "Are you there?")
    outcome = turn(page, 1).locator(".outcome")
    expect(outcome.locator(".status")).to_have_text("failed")
    expect(outcome).to_contain_text("reason: model_error")
    expect(outcome).to_contain_text("the model provider answered HTTP 500")
    assert "upstream exploded" not in outcome.inner_text()  # the provider's own text stays out
    # Not an empty bubble: no reply text at all, only the outcome.
    expect(turn(page, 1).locator(".text")).to_have_count(0)


def test_recalled_memory_and_a_handoff_are_shown(console: Console, fake: FakeOpenAIServer) -> None:
    with console.api("dave") as c:
        r = c.post("/v1/memory", json={"content": "Dave's favourite colour is teal."})
        assert r.status_code == 201, r.text
    page, _ = open_chat(console, "dave")
    fake.script(FakeToolCall("transfer_to_helper", '{"reason": "colours are my job"}'), "Teal.")
    send(page, "What is my favourite colour?")
    first = turn(page, 1)
    expect(first.locator(".text")).to_have_text("Teal.")
    recalled = first.locator("details.recalled")
    expect(recalled.locator("summary")).to_have_text("used 1 memory")
    recalled.locator("summary").click()
    expect(recalled).to_contain_text("user fact")
    # What was recalled is read with the user's key when the list opens (the event names ids).
    expect(recalled).to_contain_text("Dave's favourite colour is teal.")
    expect(
        first.get_by_text("Handed over from assistant to helper: colours are my job")
    ).to_be_visible()
    expect(first.locator(".who").last).to_have_text("helper")
    # The next turn is the helper's too (the session stays handed over), live and reloaded.
    send(page, "And my second favourite?")
    expect(turn(page, 2).locator(".outcome")).to_contain_text("completed")
    expect(turn(page, 2).locator(".who").last).to_have_text("helper")
    page.reload()
    expect(turn(page, 2).locator(".who").last).to_have_text("helper")
    # The session's agents now include the one it was handed to.
    expect(page.locator(".session-head")).to_contain_text("agents: assistant, helper")


# -- isolation -------------------------------------------------------------------------------
def test_another_user_never_lists_or_opens_a_session(
    console: Console, fake: FakeOpenAIServer
) -> None:
    page, sid = open_chat(console, "alice")
    send(page, "a secret of alice")
    expect(turn(page, 1).locator(".outcome")).to_contain_text("completed")

    bob = console.page("bob")
    bob.goto(console.url + "/")
    expect(bob.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
    expect(bob.get_by_role("list", name="Sessions")).not_to_contain_text(sid)
    bob.get_by_role("searchbox", name="Search sessions by id").fill(sid)
    expect(bob.get_by_text(f"No session id contains “{sid}”.")).to_be_visible()
    for path in (f"#/sessions/{sid}", f"#/sessions/{sid}/turns"):
        bob.goto(f"{console.url}/{path}")
        expect(bob.get_by_role("heading", name="Session not found")).to_be_visible()
        expect(bob.get_by_text("a secret of alice")).to_have_count(0)
