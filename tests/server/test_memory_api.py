"""Memory, knowledge and "forget me" over real HTTP, on a real ``tether serve``.

Every test runs on SQLite, and again on PostgreSQL when ``TETHER_TEST_POSTGRES_URL`` is set. Each
test uses users of its own on the module's server; agent and tenant memory (shared by a tenant)
is only written in the tenant ``acme``, so that it never shows up in another test's searches.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fpdf import FPDF

from tests.conformance.postgres_db import run
from tests.server.cli_keys import PROBLEM_JSON, assert_problem
from tests.server.conftest import Server, backend_store, start_server
from tether.keys import mint_key
from tether.memory.documents import MAX_DOCUMENT_BYTES
from tether.store import open_store_url

CANARY_USERS = [f"u{n:02d}" for n in range(50)]
USERS = [
    "alice",
    "bob",
    "carol",
    "dave",
    "kim",
    "lee",
    "ned",
    "olga",
    "pat",
    "badger",
    "uploader",
    "lister",
    ("boss", "default", True),
    ("frank", "acme", False),
    ("root", "acme", True),
    ("eve", "other", True),
]
ITEM_FIELDS = {
    "id",
    "scope",
    "kind",
    "content",
    "revision",
    "created_at",
    "updated_at",
    "provenance",
}


@dataclass
class Env:
    server: Server
    keys: dict[str, str]

    def client(self, user: str) -> httpx.Client:
        return self.server.client(self.keys[user], timeout=120)


def _make_keys(store_url: str) -> dict[str, str]:
    """API keys of every test user, written to the store before the server starts."""
    specs = [(u, "default", False) for u in CANARY_USERS]
    specs += [u if isinstance(u, tuple) else (u, "default", False) for u in USERS]

    async def make() -> dict[str, str]:
        store = open_store_url(store_url)
        await store.open()
        out = {}
        try:
            for user, tenant, admin in specs:
                new = mint_key(user, tenant, admin=admin)
                await store.create_api_key(new.record)
                out[user] = new.secret
        finally:
            await store.close()
        return out

    return run(make)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    data_dir = tmp_path_factory.mktemp(f"memory-{request.param}")
    with backend_store(request, data_dir) as store_url:
        keys = _make_keys(store_url)
        server = start_server(data_dir, "--store", store_url)
        try:
            yield Env(server, keys)
            # Every refusal was a problem the routes chose: nothing fell through to a 500.
            assert "unhandled error" not in server.output()
        finally:
            server.stop()


# -- helpers ---------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def remember(c: httpx.Client, content: str, **fields: Any) -> dict[str, Any]:
    r = c.post("/v1/memory", json={"content": content, **fields})
    assert r.status_code == 201, r.text
    item: dict[str, Any] = r.json()
    return item


def search(c: httpx.Client, query: str, **fields: Any) -> list[dict[str, Any]]:
    r = c.post("/v1/memory/search", json={"query": query, **fields})
    assert r.status_code == 200, r.text
    hits: list[dict[str, Any]] = r.json()["data"]
    return hits


def contents(hits: list[dict[str, Any]]) -> list[str]:
    return [h["item"]["content"] for h in hits]


def listing(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/memory", params=params)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def create_session(c: httpx.Client, agent: str = "echo") -> str:
    sid = new_id("s")
    r = c.post("/v1/sessions", json={"agent": agent, "session_id": sid})
    assert r.status_code == 201, r.text
    return sid


def knowledge_search(c: httpx.Client, collection: str, query: str, **fields: Any) -> list[Any]:
    r = c.post(f"/v1/knowledge/{collection}/search", json={"query": query, **fields})
    assert r.status_code == 200, r.text
    hits: list[Any] = r.json()["data"]
    return hits


def upload(
    c: httpx.Client,
    collection: str,
    name: str,
    data: bytes,
    media_type: str | None = None,
    **fields: str,
) -> httpx.Response:
    file = (name, data, media_type) if media_type else (name, data)
    return c.post(
        f"/v1/knowledge/{collection}/documents", files={"file": file}, data=fields or None
    )


def make_pdf(pages: list[str]) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())


# -- items -------------------------------------------------------------------------------------
def test_crud_round_trip(env: Env) -> None:
    with env.client("alice") as c:
        r = c.post(
            "/v1/memory", json={"content": "Alice prefers tea over coffee", "kind": "preference"}
        )
        assert r.status_code == 201, r.text
        item = r.json()
        assert set(item) == ITEM_FIELDS  # never the embedding
        assert item["scope"] == "user" and item["kind"] == "preference"
        assert item["revision"] == 1 and item["id"].startswith("mem_")
        assert item["provenance"] == {"session_id": None, "turn_id": None, "author": "alice"}
        assert r.headers["location"] == f"/v1/memory/{item['id']}"
        assert r.headers["etag"] == '"1"'

        got = c.get(f"/v1/memory/{item['id']}")
        assert got.status_code == 200 and got.json() == item
        assert [i["id"] for i in listing(c)] == [item["id"]]

        r = c.patch(
            f"/v1/memory/{item['id']}",
            json={"content": "Alice prefers green tea", "expected_revision": 1},
        )
        assert r.status_code == 200, r.text
        patched = r.json()
        assert (patched["content"], patched["revision"], patched["kind"]) == (
            "Alice prefers green tea",
            2,
            "preference",  # kept when the patch names none
        )
        assert patched["created_at"] == item["created_at"]
        assert patched["updated_at"] >= item["updated_at"]
        # The revision may come as an entity tag instead.
        r = c.patch(
            f"/v1/memory/{item['id']}",
            json={"content": "Alice drinks green tea", "kind": "fact"},
            headers={"If-Match": '"2"'},
        )
        assert r.status_code == 200, r.text
        assert (r.json()["revision"], r.json()["kind"], r.headers["etag"]) == (3, "fact", '"3"')
        assert contents(search(c, "what does Alice drink?")) == ["Alice drinks green tea"]

        assert c.delete(f"/v1/memory/{item['id']}").status_code == 204
        assert_problem(c.get(f"/v1/memory/{item['id']}"), 404, "not-found")
        assert_problem(c.delete(f"/v1/memory/{item['id']}"), 404, "not-found")
        assert listing(c) == []
        assert search(c, "what does Alice drink?") == []


def test_listing_pages_and_clearing_a_scope(env: Env) -> None:
    with env.client("pat") as c:
        made = [remember(c, f"note number {n}", kind="note")["id"] for n in range(5)]
        seen, cursor = [], None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            r = c.get("/v1/memory", params=params)
            assert r.status_code == 200, r.text
            seen += [i["id"] for i in r.json()["data"]]
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert seen == made

        sid = create_session(c)
        remember(c, "session note", scope="session", session_id=sid)
        assert_problem(c.delete("/v1/memory"), 422, "validation")  # the scope must be explicit
        r = c.delete("/v1/memory", params={"scope": "user"})
        assert r.status_code == 200 and r.json() == {"deleted": 5}
        assert listing(c) == []
        assert contents(search(c, "note", session_id=sid)) == ["session note"]  # other scope
        r = c.delete("/v1/memory", params={"scope": "session", "session_id": sid})
        assert r.json() == {"deleted": 1}


def test_fifty_users_each_find_only_their_own_canary(env: Env) -> None:
    canary = {u: f"my locker code is {uuid.uuid4().hex}" for u in CANARY_USERS}

    def auth(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {env.keys[user]}"}

    async def store(client: httpx.AsyncClient, user: str) -> None:
        r = await client.post("/v1/memory", json={"content": canary[user]}, headers=auth(user))
        assert r.status_code == 201, r.text

    async def find(client: httpx.AsyncClient, user: str) -> tuple[dict[str, Any], list[Any]]:
        body = {"query": "what is my locker code", "limit": 50}
        r = await client.post("/v1/memory/search", json=body, headers=auth(user))
        assert r.status_code == 200, r.text
        return r.json(), r.json()["data"]

    async def everyone() -> list[tuple[dict[str, Any], list[Any]]]:
        async with httpx.AsyncClient(base_url=env.server.url, timeout=120) as client:
            # All 50 store at once, then all 50 search at once: every search runs with all the
            # canaries in the store, each matching the query equally well.
            await asyncio.gather(*(store(client, u) for u in CANARY_USERS))
            return await asyncio.gather(*(find(client, u) for u in CANARY_USERS))

    results = asyncio.run(everyone())
    for user, (body, hits) in zip(CANARY_USERS, results, strict=True):
        assert [h["item"]["content"] for h in hits] == [canary[user]], user
        assert hits[0]["item"]["provenance"]["author"] == user
        text = json.dumps(body)
        assert [u for u, c in canary.items() if u != user and c in text] == []
    with env.client(CANARY_USERS[0]) as c:  # listing: the same
        assert [i["content"] for i in listing(c, limit=200)] == [canary[CANARY_USERS[0]]]


def test_session_memory_stays_in_its_session(env: Env) -> None:
    with env.client("lee") as c, env.client("bob") as bob:
        x, y = create_session(c), create_session(c)
        item = remember(c, "the zebra password is striped", scope="session", session_id=x)
        assert item["scope"] == "session"
        assert item["provenance"]["session_id"] == x

        assert contents(search(c, "zebra password", session_id=x)) == [item["content"]]
        assert search(c, "zebra password", session_id=y) == []
        assert search(c, "zebra password") == []  # no session named: session scope not read
        assert [i["id"] for i in listing(c, scope="session", session_id=x)] == [item["id"]]
        assert listing(c, scope="session", session_id=y) == []
        assert listing(c) == []  # not user memory either

        # Another user naming lee's session: the same 404 as a session that does not exist.
        for sid in (x, new_id("nobody")):
            r = bob.post(
                "/v1/memory", json={"content": "hi", "scope": "session", "session_id": sid}
            )
            assert_problem(r, 404, "not-found")
            r = bob.post("/v1/memory", json={"content": "hi", "session_id": sid})
            assert_problem(r, 404, "not-found")  # a user item naming it as its provenance
            assert_problem(
                bob.get("/v1/memory", params={"scope": "session", "session_id": sid}), 404
            )
            r = bob.post("/v1/memory/search", json={"query": "zebra", "session_id": sid})
            assert_problem(r, 404, "not-found")
        assert listing(bob) == []


def test_agent_and_tenant_memory_are_written_by_admins_read_by_all(env: Env) -> None:
    with env.client("frank") as frank, env.client("root") as root, env.client("eve") as eve:
        body = {"content": "the echo agent answers in haiku", "scope": "agent", "agent": "echo"}
        assert_problem(frank.post("/v1/memory", json=body), 403, "forbidden")
        assert_problem(
            frank.post("/v1/memory", json={"content": "x", "scope": "tenant"}), 403, "forbidden"
        )
        r = root.post("/v1/memory", json=body)
        assert r.status_code == 201, r.text
        shared = r.json()
        assert shared["scope"] == "agent"
        assert_problem(
            root.post("/v1/memory", json={**body, "agent": "no-such-agent"}), 404, "not-found"
        )

        hits = search(frank, "how does the agent answer", agent="echo")
        assert contents(hits) == [body["content"]]
        assert search(frank, "how does the agent answer", agent="slow") == []
        assert search(frank, "how does the agent answer") == []  # agent scope needs the name
        assert frank.get(f"/v1/memory/{shared['id']}").status_code == 200
        assert [i["id"] for i in listing(frank, scope="agent", agent="echo")] == [shared["id"]]
        # Readable, not writable.
        r = frank.patch(
            f"/v1/memory/{shared['id']}", json={"content": "mine now", "expected_revision": 1}
        )
        assert_problem(r, 403, "forbidden")
        assert_problem(frank.delete(f"/v1/memory/{shared['id']}"), 403, "forbidden")
        r = frank.delete("/v1/memory", params={"scope": "agent", "agent": "echo"})
        assert_problem(r, 403, "forbidden")

        # Tenant memory: everyone in the tenant, whatever the agent.
        tenant = remember(root, "acme closes at five", scope="tenant")
        assert contents(search(frank, "when does acme close")) == [tenant["content"]]

        # Another tenant, even an admin of it, sees none of it.
        assert_problem(eve.get(f"/v1/memory/{shared['id']}"), 404, "not-found")
        assert_problem(eve.delete(f"/v1/memory/{tenant['id']}"), 404, "not-found")
        assert search(eve, "how does the agent answer", agent="echo") == []
        assert search(eve, "when does acme close") == []

        assert frank.get(f"/v1/memory/{shared['id']}").json()["content"] == body["content"]
        assert root.delete(f"/v1/memory/{tenant['id']}").status_code == 204
        r = root.delete("/v1/memory", params={"scope": "agent", "agent": "echo"})
        assert r.json() == {"deleted": 1}


def test_a_stale_revision_is_a_conflict_naming_the_current_one(env: Env) -> None:
    with env.client("olga") as c:
        item = remember(c, "version one")
        path = f"/v1/memory/{item['id']}"
        assert c.patch(path, json={"content": "version two", "expected_revision": 1}).is_success
        r = c.patch(path, json={"content": "lost update", "expected_revision": 1})
        assert_problem(r, 409, "conflict")
        assert r.json()["current_revision"] == 2
        r = c.patch(path, json={"content": "lost update"}, headers={"If-Match": "1"})
        assert_problem(r, 409, "conflict")
        assert r.json()["current_revision"] == 2
        assert c.get(path).json()["content"] == "version two"


def test_concurrent_rewrites_of_one_revision_have_one_winner(env: Env) -> None:
    with env.client("ned") as c:
        item = remember(c, "the starting text")
    path = f"/v1/memory/{item['id']}"

    async def rewrite(client: httpx.AsyncClient, n: int) -> httpx.Response:
        body = {"content": f"rewrite number {n}", "expected_revision": 1}
        return await client.patch(path, json=body)

    async def race() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {env.keys['ned']}"}
        async with httpx.AsyncClient(base_url=env.server.url, headers=headers, timeout=60) as cl:
            return await asyncio.gather(*(rewrite(cl, n) for n in range(10)))

    responses = asyncio.run(race())
    winners = [r for r in responses if r.status_code == 200]
    assert len(winners) == 1, [r.status_code for r in responses]
    for r in responses:
        if r.status_code != 200:
            assert_problem(r, 409, "conflict")
            assert r.json()["current_revision"] == 2
    with env.client("ned") as c:
        final = c.get(path).json()
    assert (final["content"], final["revision"]) == (winners[0].json()["content"], 2)


def test_another_users_item_is_indistinguishable_from_an_unknown_one(env: Env) -> None:
    with env.client("alice") as alice, env.client("bob") as bob:
        item = remember(alice, "alice's secret is 4417")
        unknown = "mem_" + uuid.uuid4().hex[:16]
        patch = {"content": "bob was here", "expected_revision": 1}
        for method, body in (("GET", None), ("PATCH", patch), ("DELETE", None)):
            foreign = bob.request(method, f"/v1/memory/{item['id']}", json=body)
            missing = bob.request(method, f"/v1/memory/{unknown}", json=body)
            assert_problem(foreign, 404, "not-found")
            assert (foreign.status_code, foreign.content) == (missing.status_code, missing.content)
        assert_problem(bob.get("/v1/memory/" + "m" * 300), 404, "not-found")
        assert alice.get(f"/v1/memory/{item['id']}").json() == item
        assert search(bob, "secret 4417") == []


# -- forget ------------------------------------------------------------------------------------
def _seed(c: httpx.Client, who: str) -> dict[str, Any]:
    """A user with sessions (one with history), user and session memory and a document."""
    sid = create_session(c)
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": f"hello from {who}"})
    assert r.status_code == 200, r.text
    user_item = remember(c, f"{who} keeps bees on the roof")
    session_item = remember(c, f"{who} is planning a trip", scope="session", session_id=sid)
    r = upload(c, "notes", f"{who}.md", f"# {who}\n\n{who} grows purple tomatoes.\n".encode())
    assert r.status_code == 201, r.text
    assert knowledge_search(c, "notes", "purple tomatoes")
    return {"sid": sid, "user_item": user_item, "session_item": session_item, "doc": r.json()}


def test_forget_me_deletes_everything_of_the_caller_and_nothing_else(env: Env) -> None:
    with env.client("carol") as carol, env.client("dave") as dave:
        mine, theirs = _seed(carol, "carol"), _seed(dave, "dave")
        # A turn still running when the data goes: it is cancelled, not left writing.
        busy = create_session(carol, agent="slow")
        r = carol.post(f"/v1/sessions/{busy}/turns", json={"input": "go", "wait": False})
        assert r.status_code == 202, r.text
        tid = r.json()["id"]
        deadline = time.monotonic() + 10
        while carol.get(f"/v1/sessions/{busy}/turns/{tid}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)

        r = carol.delete("/v1/users/me/data")
        assert r.status_code == 200, r.text
        report = r.json()
        assert report["sessions"] == 2 and report["documents"] == 1
        assert report["memory"] >= 3  # two items and the document's chunk(s)

        for path in (f"/v1/sessions/{mine['sid']}", f"/v1/sessions/{busy}"):
            assert_problem(carol.get(path), 404, "not-found")
        assert_problem(carol.get(f"/v1/sessions/{busy}/turns/{tid}"), 404, "not-found")
        assert carol.get("/v1/sessions").json()["data"] == []
        assert listing(carol) == []
        assert_problem(carol.get(f"/v1/memory/{mine['user_item']['id']}"), 404, "not-found")
        assert_problem(carol.get(f"/v1/memory/{mine['session_item']['id']}"), 404, "not-found")
        assert search(carol, "bees on the roof") == []
        assert knowledge_search(carol, "notes", "purple tomatoes") == []
        assert carol.get("/v1/knowledge/notes/documents").json() == {"data": []}
        # The slow turn would have run ~2 s more: had it not been cancelled (and waited for)
        # before its session went, its writes would have failed (and been logged).
        time.sleep(2.5)
        assert tid not in env.server.output()
        assert carol.get("/v1/sessions").json()["data"] == []
        # Forgetting again finds nothing left.
        assert carol.delete("/v1/users/me/data").json() == {
            "sessions": 0,
            "memory": 0,
            "documents": 0,
        }

        # Dave's data is all there.
        assert dave.get(f"/v1/sessions/{theirs['sid']}").json()["item_count"] == 2
        assert contents(search(dave, "bees on the roof")) == ["dave keeps bees on the roof"]
        hits = search(dave, "planning a trip", session_id=theirs["sid"])
        assert contents(hits)[0] == "dave is planning a trip"
        found = knowledge_search(dave, "notes", "purple tomatoes")
        assert found and found[0]["document"] == "dave.md"
        assert "dave grows purple tomatoes" in found[0]["content"]


# -- knowledge ---------------------------------------------------------------------------------
MARKDOWN = b"""# Reactor maintenance

The heliotrope reactor is inspected every spring. Inspections take two days.

## Staff

The reactor crew eats lunch at noon in the east canteen.
"""

PDF_PAGES = [
    "Annual report. Revenue grew by four percent. The board met six times.",
    "Technical appendix. The heliotrope reactor is cooled with liquid ammonium zirconate, "
    "pumped at forty litres a second.",
]


def test_markdown_and_pdf_uploads_and_the_answer_from_the_pdf(env: Env) -> None:
    with env.client("kim") as c:
        r = upload(c, "plant", "maintenance.md", MARKDOWN)
        assert r.status_code == 201, r.text
        md = r.json()
        assert set(md) == {
            "id",
            "collection",
            "name",
            "media_type",
            "chunks",
            "chars",
            "scope",
            "created_at",
        }
        assert (md["collection"], md["name"], md["media_type"], md["scope"]) == (
            "plant",
            "maintenance.md",
            "text/markdown",
            "user",
        )
        assert md["chunks"] >= 1 and md["chars"] > 0
        r = upload(c, "plant", "report.pdf", make_pdf(PDF_PAGES), "application/pdf")
        assert r.status_code == 201, r.text
        pdf = r.json()
        assert (pdf["media_type"], pdf["chunks"]) == ("application/pdf", 2)
        r = c.post(
            "/v1/knowledge/plant/documents",
            json={"text": "Visitors sign in at the gate.", "name": "visitors.txt"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["media_type"] == "text/plain"

        listed = c.get("/v1/knowledge/plant/documents").json()["data"]
        assert [d["name"] for d in listed] == ["maintenance.md", "report.pdf", "visitors.txt"]
        assert c.get("/v1/knowledge/other/documents").json() == {"data": []}

        hits = knowledge_search(c, "plant", "What is the heliotrope reactor cooled with?")
        assert hits[0]["document"] == "report.pdf"
        assert hits[0]["document_id"] == pdf["id"]
        assert hits[0]["page"] == 2
        assert "ammonium zirconate" in hits[0]["content"]
        assert hits[0]["scope"] == "user"
        assert all("ammonium" not in h["content"] for h in hits[1:])
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        md_hit = knowledge_search(c, "plant", "canteen lunch")[0]
        assert (md_hit["document"], md_hit["page"]) == ("maintenance.md", None)
        assert knowledge_search(c, "other", "heliotrope reactor") == []
        assert len(knowledge_search(c, "plant", "heliotrope reactor", limit=1)) == 1

        # Nobody else finds it.
        with env.client("bob") as bob:
            assert knowledge_search(bob, "plant", "heliotrope reactor cooled") == []
            r = bob.delete(f"/v1/knowledge/plant/documents/{pdf['id']}")
            assert_problem(r, 404, "not-found")

        assert c.delete(f"/v1/knowledge/plant/documents/{pdf['id']}").status_code == 204
        assert_problem(c.delete(f"/v1/knowledge/plant/documents/{pdf['id']}"), 404, "not-found")
        hits = knowledge_search(c, "plant", "What is the heliotrope reactor cooled with?")
        assert all(h["document"] != "report.pdf" for h in hits)
        listed = c.get("/v1/knowledge/plant/documents").json()["data"]
        assert [d["name"] for d in listed] == ["maintenance.md", "visitors.txt"]


def test_collections_are_listed_by_scope_with_their_sizes(env: Env) -> None:
    with env.client("lister") as c:
        assert c.get("/v1/knowledge").json() == {"data": []}
        for collection, name in (("b-notes", "one.md"), ("a-docs", "two.txt"), ("b-notes", "x.md")):
            r = upload(c, collection, name, b"# Heading\n\nSome words about pumps.\n")
            assert r.status_code == 201, r.text
        listed = c.get("/v1/knowledge").json()["data"]
        assert [(x["name"], x["documents"]) for x in listed] == [("a-docs", 1), ("b-notes", 2)]
        assert all(x["chunks"] >= x["documents"] and x["chars"] > 0 for x in listed)
        sid = create_session(c)
        r = c.post(
            "/v1/knowledge/mine/documents",
            json={"text": "Session words.", "scope": "session", "session_id": sid},
        )
        assert r.status_code == 201, r.text
        in_session = c.get("/v1/knowledge", params={"scope": "session", "session_id": sid})
        assert [x["name"] for x in in_session.json()["data"]] == ["mine"]
        assert [x["name"] for x in c.get("/v1/knowledge").json()["data"]] == ["a-docs", "b-notes"]
        # Nobody else's: another user sees none, and a session of someone else is a 404.
        with env.client("bob") as bob:
            assert bob.get("/v1/knowledge").json() == {"data": []}
            r = bob.get("/v1/knowledge", params={"scope": "session", "session_id": sid})
            assert_problem(r, 404)
        assert_problem(c.get("/v1/knowledge", params={"scope": "session"}), 400)


def test_session_and_agent_documents_are_searched_when_named(env: Env) -> None:
    with env.client("frank") as frank, env.client("root") as root:
        sid = create_session(frank)
        r = upload(
            frank, "kb", "trip.txt", b"The ferry leaves at dawn.", scope="session", session_id=sid
        )
        assert r.status_code == 201, r.text
        assert r.json()["scope"] == "session"
        r = upload(frank, "kb", "agent.txt", b"Agents love ferries.", scope="agent", agent="echo")
        assert_problem(r, 403, "forbidden")
        r = upload(
            root,
            "kb",
            "agent.txt",
            b"The echo agent knows ferry timetables.",
            scope="agent",
            agent="echo",
        )
        assert r.status_code == 201, r.text
        agent_doc = r.json()

        assert knowledge_search(frank, "kb", "ferry") == []
        assert [h["document"] for h in knowledge_search(frank, "kb", "ferry", session_id=sid)] == [
            "trip.txt"
        ]
        found = {
            h["document"]
            for h in knowledge_search(frank, "kb", "ferry", session_id=sid, agent="echo")
        }
        assert found == {"trip.txt", "agent.txt"}
        r = frank.get("/v1/knowledge/kb/documents", params={"scope": "session", "session_id": sid})
        assert [d["name"] for d in r.json()["data"]] == ["trip.txt"]
        r = frank.delete(
            f"/v1/knowledge/kb/documents/{agent_doc['id']}",
            params={"scope": "agent", "agent": "echo"},
        )
        assert_problem(r, 403, "forbidden")
        r = root.delete(
            f"/v1/knowledge/kb/documents/{agent_doc['id']}",
            params={"scope": "agent", "agent": "echo"},
        )
        assert r.status_code == 204
        with env.client("bob") as bob:
            r = bob.post("/v1/knowledge/kb/search", json={"query": "ferry", "session_id": sid})
            assert_problem(r, 404, "not-found")


# -- bad input -----------------------------------------------------------------------------------
BAD_MEMORY: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, int]] = [
    # (method, path, json, params, status)
    ("POST", "/v1/memory", {"content": ""}, None, 422),
    ("POST", "/v1/memory", {"content": "   "}, None, 400),
    ("POST", "/v1/memory", {"content": "x" * 8_001}, None, 413),
    ("POST", "/v1/memory", {"content": "a\x00b"}, None, 400),
    ("POST", "/v1/memory", {"content": "x", "scope": "planet"}, None, 422),
    ("POST", "/v1/memory", {"content": "x", "kind": "secret"}, None, 422),
    ("POST", "/v1/memory", {"content": "x", "colour": "red"}, None, 422),
    ("POST", "/v1/memory", {"content": 5}, None, 422),
    ("POST", "/v1/memory", {"content": "x", "scope": "session"}, None, 400),
    ("POST", "/v1/memory", {"content": "x", "scope": "agent"}, None, 400),
    ("POST", "/v1/memory", {"content": "x", "session_id": "a b"}, None, 400),
    ("POST", "/v1/memory", {"content": "x", "agent": "e\x1fcho"}, None, 400),
    ("POST", "/v1/memory", {"content": "x", "agent": "e" * 129}, None, 422),
    ("GET", "/v1/memory", None, {"scope": "planet"}, 422),
    ("GET", "/v1/memory", None, {"limit": 0}, 422),
    ("GET", "/v1/memory", None, {"limit": 201}, 422),
    ("GET", "/v1/memory", None, {"cursor": -1}, 422),
    ("GET", "/v1/memory", None, {"cursor": 2**63}, 422),
    ("GET", "/v1/memory", None, {"scope": "session"}, 400),
    ("GET", "/v1/memory", None, {"scope": "session", "session_id": "x" * 129}, 400),
    ("GET", "/v1/memory", None, {"scope": "agent", "agent": "a\x00b"}, 400),
    ("DELETE", "/v1/memory", None, None, 422),
    ("DELETE", "/v1/memory", None, {"scope": "everything"}, 422),
    ("POST", "/v1/memory/search", {"query": ""}, None, 422),
    ("POST", "/v1/memory/search", {"query": "   "}, None, 400),
    ("POST", "/v1/memory/search", {"query": "x" * 2_001}, None, 422),
    ("POST", "/v1/memory/search", {"query": "x", "limit": 0}, None, 422),
    ("POST", "/v1/memory/search", {"query": "x", "limit": 51}, None, 422),
    ("POST", "/v1/memory/search", {"query": "x", "scopes": ["planet"]}, None, 422),
    ("POST", "/v1/memory/search", {"query": "x", "scopes": []}, None, 422),
    ("POST", "/v1/memory/search", {"query": "x", "session_id": "../etc"}, None, 400),
    ("POST", "/v1/knowledge/ok/search", {"query": "x", "limit": 0}, None, 422),
    ("POST", "/v1/knowledge/ok/search", {"query": "x", "limit": 51}, None, 422),
    ("POST", "/v1/knowledge/ok/search", {"query": ""}, None, 422),
    ("POST", "/v1/knowledge/ok/search", {"query": "x", "extra": 1}, None, 422),
    ("POST", "/v1/knowledge/bad name!/search", {"query": "x"}, None, 400),
    ("POST", "/v1/knowledge/" + "c" * 65 + "/search", {"query": "x"}, None, 400),
    ("GET", "/v1/knowledge/bad name!/documents", None, None, 400),
    ("GET", "/v1/knowledge/ok/documents", None, {"scope": "planet"}, 422),
    ("DELETE", "/v1/knowledge/bad name!/documents/doc_x", None, None, 400),
    ("POST", "/v1/knowledge/bad name!/documents", {"text": "hello"}, None, 400),
    ("POST", "/v1/knowledge/ok/documents", {"text": ""}, None, 422),
    ("POST", "/v1/knowledge/ok/documents", {"text": "x", "scope": "planet"}, None, 422),
    ("POST", "/v1/knowledge/ok/documents", {"text": "x", "colour": "red"}, None, 422),
    ("POST", "/v1/knowledge/ok/documents", {"text": "x", "media_type": "image/png"}, None, 400),
    ("POST", "/v1/knowledge/ok/documents", {"text": "a\x00b"}, None, 400),
    ("POST", "/v1/knowledge/ok/documents", {"text": "x", "scope": "session"}, None, 400),
    ("POST", "/v1/knowledge/ok/documents", {"text": "x", "session_id": "nope"}, None, 404),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "params", "status"),
    BAD_MEMORY,
    ids=[f"{m} {p[:40]} {json.dumps(b or q)[:40]}" for m, p, b, q, _ in BAD_MEMORY],
)
def test_bad_input_is_a_4xx_problem(
    env: Env,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    params: dict[str, Any] | None,
    status: int,
) -> None:
    with env.client("badger") as c:
        before = listing(c)
        r = c.request(method, path, json=body, params=params)
        assert_problem(r, status)
        assert listing(c) == before


def test_bad_patches_and_uploads_are_4xx_problems(env: Env) -> None:
    with env.client("badger") as c:
        item = remember(c, "badger's original")
        path = f"/v1/memory/{item['id']}"
        assert_problem(c.patch(path, json={"content": "new"}), 428, "precondition-required")
        assert_problem(c.patch(path, json={"content": "new", "expected_revision": 0}), 422)
        assert_problem(c.patch(path, json={"content": "", "expected_revision": 1}), 422)
        assert_problem(c.patch(path, json={"content": "new"}, headers={"If-Match": "*"}), 400)
        r = c.patch(
            path, json={"content": "new", "expected_revision": 1}, headers={"If-Match": "2"}
        )
        assert_problem(r, 409, "conflict")  # two preconditions: at most one holds
        assert r.json()["current_revision"] == 1
        r = c.patch(path, content=b'{"content": ', headers={"content-type": "application/json"})
        assert_problem(r, 400, "malformed-json")
        assert c.get(path).json() == item

        docs = "/v1/knowledge/ok/documents"
        assert_problem(c.post(docs, data={"scope": "user"}), 415, "unsupported-media-type")
        assert_problem(c.post(docs, files={"other": ("a.txt", b"hi")}), 422)
        assert_problem(c.post(docs, files={"file": ("a.txt", b"hi")}, data={"scope": "x"}), 422)
        assert_problem(c.post(docs, files={"file": ("a.txt", b"hi")}, data={"colour": "x"}), 422)
        assert_problem(upload(c, "ok", "junk.bin", bytes(range(256)) * 4), 400, "invalid-input")
        assert_problem(upload(c, "ok", "broken.pdf", b"%PDF-1.4\n garbage"), 400, "invalid-input")
        assert_problem(upload(c, "ok", "photo.png", b"\x89PNG", "image/png"), 400, "invalid-input")
        assert_problem(upload(c, "ok", "empty.txt", b"   \n"), 400, "invalid-input")
        # NUL characters: no store may be handed one (PostgreSQL text cannot hold it).
        for r in (
            upload(c, "ok", "nul.txt", b"hello\x00world", "text/plain"),
            upload(c, "ok", "nul16.txt", "hi\x00there".encode("utf-16")),
            c.post(docs, json={"text": "hello\x00world", "media_type": "text/plain"}),
            c.post(docs, json={"text": "hi", "name": "a\x00b.txt"}),
        ):
            assert r.status_code < 500, r.text
            assert r.status_code >= 400 or "\\u0000" not in r.text, r.text
        r = c.post(docs, content=b"hello", headers={"content-type": "text/plain"})
        assert_problem(r, 415, "unsupported-media-type")
        r = c.post(
            docs,
            content=b"--x\r\nbroken",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        assert 400 <= r.status_code < 500
        assert_problem(r, r.status_code)
        r = c.post(docs, content=b'{"text": ', headers={"content-type": "application/json"})
        assert_problem(r, 400, "malformed-json")
        r = c.post("/v1/knowledge/ok/search", json={"query": "hello world there"})
        assert r.status_code == 200 and "\\u0000" not in r.text, r.text
        for doc in c.get("/v1/knowledge/ok/documents").json()["data"]:
            assert c.delete(f"/v1/knowledge/ok/documents/{doc['id']}").status_code == 204


def test_upload_size_bounds(env: Env) -> None:
    with env.client("uploader") as c:
        # Uploads may be bigger than other bodies (1 MiB)...
        big_text = ("A big notebook line about kites and kettles.\n\n" * 30_000).encode()
        assert 1024 * 1024 < len(big_text) < MAX_DOCUMENT_BYTES
        r = upload(c, "big", "notebook.txt", big_text)
        assert r.status_code == 201, r.text
        assert c.delete(f"/v1/knowledge/big/documents/{r.json()['id']}").status_code == 204
        r = c.post("/v1/memory", json={"content": "k" * (1024 * 1024 + 10)})
        assert_problem(r, 413, "too-large")

        # ...up to the document bound: one byte over it, or a body far over it, is a 413.
        over = b"a" * (MAX_DOCUMENT_BYTES + 1)
        assert_problem(upload(c, "big", "over.txt", over), 413, "too-large")
        huge = b"a" * (MAX_DOCUMENT_BYTES + 1024 * 1024)
        assert_problem(upload(c, "big", "huge.txt", huge), 413, "too-large")

        def chunks() -> Iterator[bytes]:
            head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="h.txt"\r\n\r\n'
            yield head
            for start in range(0, len(huge), 1024 * 1024):
                yield huge[start : start + 1024 * 1024]
            yield b"\r\n--b--\r\n"

        r = c.post(
            "/v1/knowledge/big/documents",
            content=chunks(),
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert r.request.headers["transfer-encoding"] == "chunked"
        assert_problem(r, 413, "too-large")
        assert c.get("/v1/knowledge/big/documents").json() == {"data": []}


def test_openapi_documents_every_memory_route_with_its_problems(env: Env) -> None:
    with env.client("bob") as c:
        doc = c.get("/openapi.json").json()
    ops = {
        (m, p): op
        for p, item in doc["paths"].items()
        if p.startswith(("/v1/memory", "/v1/knowledge", "/v1/users"))
        for m, op in item.items()
    }
    assert set(ops) == {
        ("get", "/v1/memory"),
        ("post", "/v1/memory"),
        ("delete", "/v1/memory"),
        ("post", "/v1/memory/search"),
        ("get", "/v1/memory/{item_id}"),
        ("patch", "/v1/memory/{item_id}"),
        ("delete", "/v1/memory/{item_id}"),
        ("get", "/v1/knowledge"),
        ("post", "/v1/knowledge/{collection}/documents"),
        ("get", "/v1/knowledge/{collection}/documents"),
        ("delete", "/v1/knowledge/{collection}/documents/{doc_id}"),
        ("post", "/v1/knowledge/{collection}/search"),
        ("delete", "/v1/users/me/data"),
    }
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for key, op in ops.items():
        codes = {int(code) for code in op["responses"]}
        assert {401, 503} <= codes, key
        assert any(200 <= code < 300 for code in codes), key
        for code, response in op["responses"].items():
            if int(code) >= 400:
                assert response["content"] == problem, (key, code)
        if "requestBody" in op:
            assert {400, 413, 422} <= codes, key
        if "{collection}" in key[1]:
            assert 400 in codes, key
    upload_body = ops[("post", "/v1/knowledge/{collection}/documents")]["requestBody"]
    assert set(upload_body["content"]) == {"multipart/form-data", "application/json"}
    assert 415 in {
        int(c) for c in ops[("post", "/v1/knowledge/{collection}/documents")]["responses"]
    }
    assert 409 in {int(c) for c in ops[("patch", "/v1/memory/{item_id}")]["responses"]}
    assert 403 in {int(c) for c in ops[("post", "/v1/memory")]["responses"]}
