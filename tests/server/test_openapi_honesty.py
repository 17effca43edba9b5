"""The schema says what the server enforces: every request valid by ``/openapi.json`` is accepted.

schemathesis's ``positive_data_acceptance`` (its ST202) sends schema-valid requests to every
operation and fails on any refusal other than those a schema cannot foresee (401, 403, 404,
409, 429; and 5xx, which the other checks here catch). Rules the schema used to leave unsaid:
an agent name is 1-128 characters without control characters, an idempotency key may not be
reused for another request (a 422 across requests), a listing's cursor is of its order, session
scope needs a
``session_id`` and agent scope an ``agent`` (bodies and query strings alike), ``If-Match``
carries a revision, memory content and document text are more than whitespace and hold no NUL,
and a document part is text, Markdown, HTML or PDF, not any binary (a PNG). An OpenAI-face
conversation that ends with the assistant's reply is a 400 (no schema says "the last of these"),
and so is one naming two sessions (the header and ``metadata.session_id``).

What no schema can state is left to the fuzzer's knowledge: a ``text/plain`` or
``text/markdown`` part is generated as text (registered below), not as random bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error, positive_data_acceptance
from schemathesis.core.media_types import MEDIA_TYPE_STRATEGIES

from tests.server.conftest import Server
from tests.server.test_fuzz import EXAMPLES, FUZZ_SID, Operation, Target, operations

TEXT_TYPES = ("text/plain", "text/markdown")
INDEXABLE = re.compile(r"[^\s\x00-\x08\x0e-\x1f\x7f\x85\u00ad\ufeff]")
"""A character the chunker keeps (not whitespace, an invisible control, soft hyphen or BOM)."""


@pytest.fixture
def text_parts() -> Iterator[None]:
    """Document parts of a text type are generated as UTF-8 text with something to index."""
    text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=200)
    strategy = text.filter(lambda t: INDEXABLE.search(t) is not None).map(str.encode)
    for media_type in TEXT_TYPES:
        schemathesis.openapi.media_type(media_type, strategy)
    yield
    for media_type in TEXT_TYPES:  # the registry is global: leave the other tests theirs
        MEDIA_TYPE_STRATEGIES.pop(media_type, None)


def _names_another_turn(case: Case[Any]) -> bool:
    """A ``Last-Event-ID`` of some other turn than the path's (the server answers 400)."""
    header = {k.lower(): v for k, v in (case.headers or {}).items()}.get("last-event-id")
    tid = (case.path_parameters or {}).get("tid")
    return bool(header) and isinstance(header, str) and header.strip().rpartition(":")[0] != tid


def _cursor_of_another_order(case: Case[Any]) -> bool:
    """``order=newest`` with a cursor of the id order (a bare id; the server answers 400): one
    parameter's form depends on another's, which a schema cannot say."""
    query = case.query or {}
    cursor = query.get("cursor")
    return query.get("order") == "newest" and isinstance(cursor, str) and "|" not in cursor


def _ends_with_the_reply(case: Case[Any]) -> bool:
    """An OpenAI-face conversation whose last user, assistant or tool message is not the
    user's (the server answers 400: nothing new to answer): a rule on an array's last item of a
    kind, which a schema cannot state."""
    body = case.body if isinstance(case.body, dict) else {}
    messages = body.get("messages", body.get("input"))
    if not isinstance(messages, list):
        return False
    roles = [m.get("role") for m in messages if isinstance(m, dict) and m.get("role") in _SPEAKERS]
    return "user" in roles and roles[-1] != "user"


_SPEAKERS = ("user", "assistant", "tool")


def _two_sessions_named(case: Case[Any]) -> bool:
    """An OpenAI-face call naming one session in ``X-Tether-Session`` and another in
    ``metadata.session_id`` (the server answers 400): a rule between a header and the body."""
    header = {k.lower(): v for k, v in (case.headers or {}).items()}.get("x-tether-session")
    body = case.body if isinstance(case.body, dict) else {}
    metadata = body.get("metadata")
    named = metadata.get("session_id") if isinstance(metadata, dict) else None
    return bool(header) and bool(named) and header != named


def _reuses_a_key(response: Any) -> bool:
    try:
        kind = response.json().get("type", "")
    except ValueError:
        return False
    return isinstance(kind, str) and kind.endswith("/idempotency-key-reused")


def accept(op: Operation, target: Target, base_url: str) -> int:
    runs = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE), aim=st.booleans())
    def run(case: Case[Any], aim: bool) -> None:
        nonlocal runs
        runs += 1
        if aim and "sid" in (case.path_parameters or {}):
            assert case.path_parameters is not None
            case.path_parameters["sid"] = FUZZ_SID
            if "tid" in case.path_parameters:
                case.path_parameters["tid"] = target.turn_id
        response = case.call(base_url=base_url, timeout=30)
        target.statuses[(f"{op.method.upper()} {op.path}", response.status_code)] += 1
        if _names_another_turn(case) or _cursor_of_another_order(case):
            # A rule between a header and the path, or two parameters, no schema can state.
            assert response.status_code in (400, 404), response.text
            return
        if _ends_with_the_reply(case) or _two_sessions_named(case):
            assert response.status_code in (400, 401, 404), response.text
            return
        if response.status_code == 422 and _reuses_a_key(response):
            # A rule across requests: the key already named another request on this session
            # (the IETF Idempotency-Key draft's 422), which no schema of one request can state.
            return
        case.validate_response(response, checks=[positive_data_acceptance, not_a_server_error])
        if op.method.upper() in ("DELETE", "PATCH"):
            target.ensure()

    run()
    return runs


@pytest.mark.slow
@pytest.mark.usefixtures("text_parts")
def test_every_schema_valid_request_is_accepted(server: Server) -> None:
    with server.client() as client:
        target = Target(client)
        target.ensure()
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        acceptance = schema.config.checks.positive_data_acceptance
        # 428: a rewrite must name the revision it read, in the body or in If-Match: a rule
        # across body and header, which is HTTP's own status for it (RFC 6585).
        acceptance.expected_statuses = [*acceptance.expected_statuses, "428"]
        runs = {
            f"{op.method.upper()} {op.path}": accept(op, target, server.url)
            for op in operations(schema)
        }
    assert all(runs.values()), runs
    # The rules are stated, not dodged: the valid cases reached past them.
    ok = {name for (name, code), _ in target.statuses.items() if code < 300}
    for name in (
        "POST /v1/memory",
        "GET /v1/memory",
        "DELETE /v1/memory",
        "POST /v1/knowledge/{collection}/documents",
        "GET /v1/knowledge/{collection}/documents",
    ):
        assert name in ok, name


def test_the_scope_rule_is_one_query_object(server: Server) -> None:
    """OpenAPI ties query parameters together only inside one object: ``scope``,
    ``session_id`` and ``agent`` are one exploded ``target`` (the same query string)."""
    doc = httpx.get(server.url + "/openapi.json").json()
    op = doc["paths"]["/v1/memory"]["get"]
    (target,) = [p for p in op["parameters"] if p["name"] == "target"]
    assert {p["name"] for p in op["parameters"]} == {"target", "limit", "cursor"}
    assert (target["in"], target["style"], target["explode"]) == ("query", "form", True)
    assert set(target["schema"]["properties"]) == {"scope", "session_id", "agent"}
    with server.client() as c:
        r = c.get("/v1/memory", params={"scope": "session"})
        assert r.status_code == 400, r.text  # what the schema now says is invalid
