"""The console's memory and knowledge views, the turns view, "forget me", and screenshots of
the main views at desktop size and at 375 px (saved as test artifacts)."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import FilePayload, Page, expect

from tests.console.conftest import PHONE, TIMEOUT_MS, Console, Shoot
from tests.memory.test_documents import make_pdf
from tether.testing.fake_openai import FakeError, FakeOpenAIServer, FakeToolCall

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=TIMEOUT_MS)

MARKDOWN = """# Reactor maintenance

The heliotrope reactor is inspected every spring. Inspections take two days.

## Staff

The reactor crew eats lunch at noon in the east canteen.
"""
PDF_PAGES = [
    "Annual report. Revenue grew by four percent. The board met six times.",
    "Technical appendix. The heliotrope reactor is cooled with liquid ammonium zirconate, "
    "pumped at forty litres a second.",
]


UNNAMED_CONTROLS = """() => [...document.querySelectorAll(
    'button, a[href], input, select, textarea, [role=button]')]
  .filter((el) => el.offsetParent !== null || el.type === 'file')
  .filter((el) => {
    const labelled = el.getAttribute('aria-labelledby');
    const name = el.getAttribute('aria-label') || el.getAttribute('title')
      || (labelled && document.getElementById(labelled)?.textContent)
      || [...(el.labels || [])].map((l) => l.textContent).join('')
      || (['BUTTON', 'A'].includes(el.tagName) ? el.textContent : '');
    return !name.trim();
  })
  .map((el) => el.outerHTML.slice(0, 120))"""
"""Every visible control must have an accessible name (the tests find them by it)."""


def remember(console: Console, user: str, content: str, **fields: str) -> dict[str, object]:
    with console.api(user) as c:
        r = c.post("/v1/memory", json={"content": content, **fields})
        assert r.status_code == 201, r.text
        item: dict[str, object] = r.json()
        return item


def drop_file(page: Page, name: str, text: str, media_type: str) -> None:
    """Drag a file from the desktop onto the drop zone (a DataTransfer holding a File)."""
    page.evaluate(
        """([name, text, type]) => {
          const transfer = new DataTransfer();
          transfer.items.add(new File([text], name, {type}));
          const zone = document.querySelector('[aria-label="Drop files to upload"]');
          for (const kind of ['dragenter', 'dragover', 'drop']) {
            zone.dispatchEvent(new DragEvent(kind, {dataTransfer: transfer, bubbles: true,
                                                    cancelable: true}));
          }
        }""",
        [name, text, media_type],
    )


def test_upload_by_drop_and_by_chooser_then_search_finds_the_pdf(console: Console) -> None:
    page = console.page("alice")
    page.goto(console.url + "/#/knowledge")
    collection = page.get_by_role("textbox", name="Collection")
    collection.fill("plant")
    collection.press("Enter")
    expect(page.get_by_text("No documents in this collection yet.")).to_be_visible()

    drop_file(page, "maintenance.md", MARKDOWN, "text/markdown")
    pdf: FilePayload = {
        "name": "report.pdf",
        "mimeType": "application/pdf",
        "buffer": make_pdf(PDF_PAGES),
    }
    page.get_by_label("Choose files to upload").set_input_files([pdf])
    uploads = page.get_by_role("list", name="Uploads")
    for name in ("maintenance.md", "report.pdf"):
        bar = uploads.get_by_role("progressbar", name=f"Uploading {name}")
        expect(bar).to_have_attribute("value", "100")
        expect(uploads.locator("li", has_text=name).locator(".upload-state")).to_contain_text(
            "added:"
        )
    documents = page.get_by_role("table", name="Documents")
    expect(documents.get_by_role("cell", name="report.pdf", exact=True)).to_be_visible()
    expect(documents.get_by_role("cell", name="maintenance.md", exact=True)).to_be_visible()
    expect(documents.get_by_role("cell", name="application/pdf")).to_be_visible()
    collections = page.get_by_role("list", name="Collections")
    expect(collections).to_contain_text("plant 2 documents")

    search = page.get_by_role("search", name="Try a search")
    search.get_by_role("searchbox", name="Search the collection").fill(
        "What is the heliotrope reactor cooled with?"
    )
    search.get_by_role("button", name="Search").click()
    best = page.get_by_role("list", name="Search results").get_by_role("listitem").first
    expect(best).to_contain_text("report.pdf page 2")
    expect(best).to_contain_text("ammonium zirconate")

    documents.get_by_role("button", name="Delete maintenance.md").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(documents.get_by_role("cell", name="maintenance.md", exact=True)).to_have_count(0)
    with console.api("alice") as c:
        names = [d["name"] for d in c.get("/v1/knowledge/plant/documents").json()["data"]]
    assert names == ["report.pdf"]


def test_an_edit_that_lost_a_race_shows_the_newer_text(console: Console) -> None:
    item = remember(console, "bob", "Bob drinks tea.")
    item_id = str(item["id"])
    mine = console.page("bob")
    mine.goto(console.url + "/#/memory")
    entry = mine.get_by_role("listitem", name=f"Memory {item_id}")
    expect(entry).to_contain_text("Bob drinks tea.")
    entry.get_by_role("button", name="Edit").click()

    # Meanwhile, in another tab:
    other = console.tab(mine.context, "bob")
    other.goto(console.url + "/#/memory")
    theirs = other.get_by_role("listitem", name=f"Memory {item_id}")
    theirs.get_by_role("button", name="Edit").click()
    theirs.get_by_role("textbox", name="Edit memory").fill("Bob drinks green tea.")
    theirs.get_by_role("button", name="Save").click()
    expect(theirs).to_contain_text("revision 2")

    entry.get_by_role("textbox", name="Edit memory").fill("Bob drinks coffee.")
    entry.get_by_role("button", name="Save").click()
    conflict = entry.get_by_role("alert")
    expect(conflict).to_contain_text("Changed elsewhere while you edited it (now revision 2)")
    expect(conflict.locator("blockquote")).to_have_text("Bob drinks green tea.")
    expect(entry.get_by_role("textbox", name="Edit memory")).to_have_value("Bob drinks coffee.")
    entry.get_by_role("button", name="Save mine over it").click()
    expect(entry).to_contain_text("Bob drinks coffee.")
    expect(entry).to_contain_text("revision 3")
    with console.api("bob") as c:
        assert c.get(f"/v1/memory/{item_id}").json()["content"] == "Bob drinks coffee."


def test_memory_by_scope_with_automatic_notes_marked(
    console: Console, fake: FakeOpenAIServer
) -> None:
    sid = f"notes-{uuid.uuid4().hex[:8]}"
    with console.api("carol") as c:
        assert c.post("/v1/sessions", json={"session_id": sid, "agent": "noter"}).status_code == 201
    remember(console, "carol", "Carol prefers short answers.", kind="preference")
    remember(console, "carol", "Carol is learning Welsh.")
    page = console.page("carol")
    page.goto(f"{console.url}/#/sessions/{sid}")
    page.get_by_role("textbox", name="Message").fill("My name is Carol.")
    page.keyboard.press("Enter")
    expect(page.get_by_text("Remembered (session): The user's name is Carol.")).to_be_visible()

    page.goto(console.url + "/#/memory")
    items = page.get_by_role("list", name="Memory items")
    expect(items.get_by_role("listitem")).to_have_count(2)
    expect(items).to_contain_text("preference")
    page.get_by_role("combobox", name="Scope").select_option("session")
    page.get_by_role("combobox", name="Session").select_option(sid)
    note = items.get_by_role("listitem").filter(has_text="The user's name is Carol.")
    expect(note).to_contain_text("automatic note")

    # Delete one of the user's items, then clear the rest of the scope.
    page.get_by_role("combobox", name="Scope").select_option("user")
    welsh = items.get_by_role("listitem").filter(has_text="Welsh")
    welsh.get_by_role("button", name="Delete").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(items.get_by_role("listitem")).to_have_count(1)
    page.get_by_role("button", name="Clear this scope").click()
    page.get_by_role("dialog").get_by_role("button", name="Clear").click()
    expect(page.get_by_text("Nothing remembered here.")).to_be_visible()


def test_the_turns_view_shows_outcomes_timings_and_events(
    console: Console, fake: FakeOpenAIServer
) -> None:
    sid = f"turns-{uuid.uuid4().hex[:8]}"
    with console.api("alice") as c:
        assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
        assert c.post(f"/v1/sessions/{sid}/turns", json={"input": "first"}).status_code == 200
        fake.script(FakeError(500))
        assert c.post(f"/v1/sessions/{sid}/turns", json={"input": "second"}).status_code == 502
    page = console.page("alice")
    page.goto(f"{console.url}/#/sessions/{sid}/turns")
    turns = page.get_by_role("list", name="Turns")
    rows = turns.get_by_role("listitem")
    expect(rows).to_have_count(2)
    failed = rows.filter(has_text="second")
    expect(failed).to_contain_text("failed model_error")
    failed.locator("summary").click()
    expect(failed).to_contain_text("the model provider answered HTTP 500")
    expect(failed.get_by_text("model calls")).to_be_visible()
    failed.get_by_role("button", name="Show events").click()
    events = failed.get_by_role("list", name="Events of turn 2")
    expect(events.get_by_role("listitem").last).to_contain_text("turn.ended")
    expect(events).to_contain_text('"reason": "model_error"')


def test_forget_me_needs_the_typed_phrase(console: Console) -> None:
    with console.api("dave") as c:
        assert c.post("/v1/sessions", json={"session_id": "dave-1"}).status_code == 201
    remember(console, "dave", "Dave has a cat.")
    page = console.page("dave")
    page.goto(console.url + "/#/account")
    page.get_by_role("button", name="Forget me").click()
    dialog = page.get_by_role("dialog", name="Forget everything of yours?")
    confirm = dialog.get_by_role("button", name="Delete all my data")
    expect(confirm).to_be_disabled()
    dialog.get_by_role("textbox").fill("forget")
    expect(confirm).to_be_disabled()
    dialog.get_by_role("textbox").fill("forget me")
    confirm.click()
    expect(page.get_by_text("Deleted 1 sessions, 1 memory items and 0 documents.")).to_be_visible()
    with console.api("dave") as c:
        assert c.get("/v1/sessions").json()["data"] == []
        assert c.get("/v1/memory").json()["data"] == []


def test_screenshots_of_the_main_views(
    console: Console, fake: FakeOpenAIServer, shoot: Shoot
) -> None:
    """The pictures for the README and docs/console/, and nothing wider than a phone."""
    user = "erin"
    with console.api(user) as c:
        for sid, title in (("trip-planning", "Trip to Lisbon"), ("launch-review", None)):
            meta = {"title": title} if title else {}
            assert c.post("/v1/sessions", json={"session_id": sid, "metadata": meta}).status_code
        c.post("/v1/memory", json={"content": "Erin flies from Bristol.", "kind": "fact"})
        c.post("/v1/memory", json={"content": "Erin likes window seats.", "kind": "preference"})
        guide = MARKDOWN.replace("reactor", "tram").encode()
        for file in (
            ("lisbon-guide.md", guide, "text/markdown"),
            ("report.pdf", make_pdf(PDF_PAGES), "application/pdf"),
        ):
            r = c.post("/v1/knowledge/knowledge/documents", files={"file": file})
            assert r.status_code == 201, r.text
        fake.script("Lisbon in May is warm: around 22 °C, with long, dry days.")
        c.post("/v1/sessions/trip-planning/turns", json={"input": "What is Lisbon like in May?"})
    page = console.page(user)
    page.goto(console.url + "/#/sessions/trip-planning")
    fake.script(
        FakeToolCall("launch", '{"target": "booking: BRS → LIS, 14 May, window seat"}'),
        "Booked: Bristol to Lisbon on 14 May, window seat.",
    )
    page.get_by_role("textbox", name="Message").fill("Book me a flight on 14 May, window seat.")
    page.keyboard.press("Enter")
    expect(page.get_by_role("group", name="Approval for tool launch")).to_be_visible()
    views: list[tuple[str, str | None]] = [("chat", None)]
    views += [
        ("sessions", "/#/"),
        ("turns", "/#/sessions/trip-planning/turns"),
        ("memory", "/#/memory"),
        ("knowledge", "/#/knowledge"),
    ]
    for name, path in views:
        if path:
            page.goto(console.url + path)
            expect(page.locator("main h1")).to_be_visible()
            page.wait_for_load_state("networkidle")
        shoot(page, f"console-{name}")
        unnamed = page.evaluate(UNNAMED_CONTROLS)
        assert unnamed == [], f"controls without an accessible name in {name}: {unnamed}"
        shown = page.locator("main").inner_text()
        assert not re.search(r"\b(null|undefined|NaN)\b|\[object ", shown), shown
        page.set_viewport_size(PHONE)  # type: ignore[arg-type]
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name} is {overflow} px wider than a 375 px screen"
        page.set_viewport_size({"width": 1280, "height": 800})
