"""Property-based fuzzing of the running server from its own ``/openapi.json`` (schemathesis).

Every operation gets valid (positive) and schema-violating (negative) requests, deterministically
(``derandomize``) and in bounded number. Checks: no 5xx; every status, content type, header and
body as documented; schema-violating requests refused with a 4xx. Half the cases aim at a real
session (and a real turn of it), so the fuzzer reaches past the 404 for unknown ids. Only
127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis

# Imported here, at collection, rather than by from_url deep inside a test: schemathesis is a
# pytest plugin, so its modules go through the assertion rewriter, and CPython 3.11.7 can fail
# a compile run deep in a call stack ("AST constructor recursion depth mismatch", seen in CI).
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation
from schemathesis.transport.serialization import Binary

from tests.server.conftest import Server

EXAMPLES = 50
"""Cases per operation and mode (at most): about 1,500 requests, well under a minute."""

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

FUZZ_SID = "fuzz"

Operation = APIOperation[Any, Any, Any, Any]


@dataclass
class Target:
    """A real session (and a turn of it) that half the cases are pointed at."""

    client: httpx.Client
    turn_id: str = ""
    statuses: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)

    def ensure(self) -> None:
        """(Re)create the session after a case deleted or expired it, with one ended turn."""
        r = self.client.get(f"/v1/sessions/{FUZZ_SID}")
        if r.status_code == 200 and r.json()["turn_count"]:
            return
        r = self.client.post("/v1/sessions", json={"agent": "echo", "session_id": FUZZ_SID})
        assert r.status_code in (201, 409), r.text
        r = self.client.post(f"/v1/sessions/{FUZZ_SID}/turns", json={"input": "seed"})
        assert r.status_code == 200, r.text
        self.turn_id = r.json()["id"]


def operations(schema: Any) -> list[Operation]:
    found = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        found.append(result.ok())
    return found


def conforms(op: Operation, case: Case[Any]) -> bool:
    """Whether a schema-violating case's only violated part, its body, is valid after all.

    Schemathesis takes some bodies a conditional schema (``if``/``then``) allows for violating
    it: a form without ``scope`` was taken to break "with scope agent, an agent is required"
    (ST201 in CI, once, on a knowledge upload). Such a case is not negative, so the server need
    not refuse it; the schema's own validator says which cases they are."""
    if case.meta is None:
        return False
    negated = [
        location
        for location, info in case.meta.components.items()
        if info.mode is GenerationMode.NEGATIVE
    ]
    if negated != [ParameterLocation.BODY] or not isinstance(case.body, dict):
        return False
    return body_conforms(op, case.media_type, case.body)


def body_conforms(op: Operation, media_type: str | None, body: dict[str, Any]) -> bool:
    plain = {k: _text(v) for k, v in body.items()}
    return any(alt.media_type == media_type and alt.is_valid(plain) for alt in op.body)


def _text(value: Any) -> Any:
    """A form's file part as the schema sees it (a string, ``format: binary``)."""
    if isinstance(value, Binary):
        return value.data.decode("latin-1")
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def fuzz(op: Operation, mode: GenerationMode, target: Target, base_url: str) -> int:
    """Run one operation's cases; the number run (0 when the mode has nothing to vary)."""
    negative = mode is GenerationMode.NEGATIVE
    runs = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    @given(case=op.as_strategy(generation_mode=mode), aim=st.booleans())
    def run(case: Case[Any], aim: bool) -> None:
        nonlocal runs
        runs += 1
        # Schema-violating path values stay as generated; valid ones may aim at the real session.
        if aim and mode is GenerationMode.POSITIVE and "sid" in (case.path_parameters or {}):
            assert case.path_parameters is not None
            case.path_parameters["sid"] = FUZZ_SID
            if "tid" in case.path_parameters:
                case.path_parameters["tid"] = target.turn_id
        response = case.call(base_url=base_url, timeout=30)
        target.statuses[(f"{op.method.upper()} {op.path}", response.status_code)] += 1
        refused = negative and not conforms(op, case)
        case.validate_response(
            response, checks=[*CHECKS, negative_data_rejection] if refused else CHECKS
        )
        if op.method.upper() in ("DELETE", "PATCH"):
            target.ensure()

    try:
        run()
    except Exception as exc:
        # An operation with nothing to violate (no parameters, no body) has no negative cases.
        if mode is GenerationMode.NEGATIVE and type(exc).__name__ == "Unsatisfiable":
            return 0
        raise
    return runs


ROUTES = {
    ("get", "/v1/memory"): "200",
    ("post", "/v1/memory"): "201",
    ("delete", "/v1/memory"): "200",
    ("post", "/v1/memory/search"): "200",
    ("get", "/v1/memory/{item_id}"): "200",
    ("patch", "/v1/memory/{item_id}"): "200",
    ("delete", "/v1/memory/{item_id}"): "204",
    ("get", "/v1/knowledge"): "200",
    ("post", "/v1/knowledge/{collection}/documents"): "201",
    ("get", "/v1/knowledge/{collection}/documents"): "200",
    ("delete", "/v1/knowledge/{collection}/documents/{doc_id}"): "204",
    ("post", "/v1/knowledge/{collection}/search"): "200",
    ("delete", "/v1/users/me/data"): "200",
    ("get", "/healthz"): "200",
    ("get", "/readyz"): "200",
    ("get", "/v1/agents"): "200",
    ("post", "/v1/sessions"): "201",
    ("get", "/v1/sessions"): "200",
    ("get", "/v1/sessions/{sid}"): "200",
    ("patch", "/v1/sessions/{sid}"): "200",
    ("delete", "/v1/sessions/{sid}"): "204",
    ("get", "/v1/sessions/{sid}/items"): "200",
    ("delete", "/v1/sessions/{sid}/items"): "204",
    ("post", "/v1/sessions/{sid}/turns"): "200",
    ("get", "/v1/sessions/{sid}/turns"): "200",
    ("get", "/v1/sessions/{sid}/turns/{tid}"): "200",
    ("get", "/v1/sessions/{sid}/turns/{tid}/events"): "200",
    ("post", "/v1/sessions/{sid}/turns/{tid}/cancel"): "200",
    ("post", "/v1/sessions/{sid}/turns/{tid}/decisions"): "200",
    ("get", "/v1/sessions/{sid}/turns/{tid}/decisions"): "200",
    ("get", "/v1/sessions/{sid}/decisions"): "200",
    ("post", "/api/chat"): "200",
    ("post", "/agent"): "200",
    ("post", "/agents/{name}"): "200",
    ("get", "/v1/models"): "200",
    ("get", "/v1/models/{model}"): "200",
    ("post", "/v1/chat/completions"): "200",
    ("post", "/v1/responses"): "200",
    ("get", "/v1/responses/{response_id}"): "200",
    ("post", "/v1/responses/{response_id}/cancel"): "200",
}
OPENAI_FACE = {
    "/v1/models",
    "/v1/models/{model}",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel",
}
"""Errors in OpenAI's shape, not problem+json (but for the body limit's 413)."""


def test_openapi_lists_every_route_with_its_errors(server: Server) -> None:
    with server.client() as c:
        doc = c.get("/openapi.json").json()
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert set(ops) == set(ROUTES)
    components = doc["components"]["schemas"]
    assert "HTTPValidationError" not in components  # FastAPI's error shape is not ours
    assert set(components["Problem"]["required"]) == {"type", "title", "status", "detail"}
    for (method, path), op in ops.items():
        responses = op["responses"]
        codes = {int(code) for code in responses}
        assert ROUTES[(method, path)] in responses, (method, path)
        for code, response in responses.items():
            if int(code) >= 400 and path in OPENAI_FACE and code != "413":
                assert set(response["content"]) == {"application/json"}, (method, path, code)
                assert response["description"]
            elif int(code) >= 400:
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (method, path, code)
                assert response["description"]
        if path not in ("/healthz", "/readyz"):
            assert {401, 503} <= codes, (method, path)
        if "{sid}" in path:
            assert {400, 404} <= codes, (method, path)
            sid = next(p for p in op["parameters"] if p["name"] == "sid")
            assert sid["schema"]["pattern"] == r"^(?!\.+$)[A-Za-z0-9._:-]{1,128}$"
        if "requestBody" in op:
            assert {400, 413, 422} <= codes, (method, path)
        if not op.get("parameters") and "requestBody" not in op:
            assert 422 not in codes, (method, path)
    assert {202, 409, 429, 502} <= {
        int(c) for c in ops[("post", "/v1/sessions/{sid}/turns")]["responses"]
    }
    assert {409, 429, 500, 502} <= {int(c) for c in ops[("post", "/api/chat")]["responses"]}
    for route in (
        ("post", "/v1/sessions/{sid}/turns"),
        ("get", "/v1/sessions/{sid}/turns/{tid}/events"),
    ):
        stream = ops[route]["responses"]["200"]["content"]["text/event-stream"]
        assert stream == {"schema": {"$ref": "#/components/schemas/ServerSentEvent"}}


@pytest.mark.slow
def test_the_api_survives_fuzzing_as_documented(server: Server) -> None:
    with server.client() as client:
        target = Target(client)
        target.ensure()
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        ops = operations(schema)
        assert len(ops) == len(ROUTES)

        started = time.monotonic()
        runs = {
            (op.method.upper(), op.path, mode.value): fuzz(op, mode, target, server.url)
            for op in ops
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        }
        elapsed = time.monotonic() - started

    total = sum(runs.values())
    by_status: collections.Counter[int] = collections.Counter()
    for (_, code), n in target.statuses.items():
        by_status[code] += n
    negative = sum(n for (_, _, mode), n in runs.items() if mode == "negative")
    print(
        f"\nfuzz: {total} cases ({negative} negative) over {len(ops)} operations"
        f" in {elapsed:.1f}s; statuses {dict(sorted(by_status.items()))}"
    )
    assert all(n > 0 for (_, _, mode), n in runs.items() if mode == "positive")
    # The aimed cases got past the 404: real sessions and turns were read, changed and run.
    reached = {name for (name, code), _ in target.statuses.items() if code < 300}
    for name in (
        "GET /v1/sessions/{sid}",
        "PATCH /v1/sessions/{sid}",
        "GET /v1/sessions/{sid}/items",
        "POST /v1/sessions/{sid}/turns",
        "GET /v1/sessions/{sid}/turns/{tid}",
        "GET /v1/sessions/{sid}/turns/{tid}/events",
        "POST /v1/sessions/{sid}/turns/{tid}/cancel",
        "POST /api/chat",
    ):
        assert name in reached, name
    assert not any(code >= 500 for (_, code) in target.statuses)


def test_a_body_the_schema_allows_is_not_taken_for_a_violation(server: Server) -> None:
    """What keeps schemathesis's mistaken negatives out of the refusal check: a knowledge
    upload's form without ``scope`` (hence no agent needed) conforms; one naming the agent
    scope without an agent does not."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    (op,) = [
        o
        for o in operations(schema)
        if o.path == "/v1/knowledge/{collection}/documents" and o.method.lower() == "post"
    ]
    form = "multipart/form-data"
    assert body_conforms(op, form, {"file": Binary(b"%PDF-1.4"), "agent": "\x85<iXA"})
    assert body_conforms(op, form, {"file": b"text", "scope": "agent", "agent": "a"})
    assert not body_conforms(op, form, {"file": b"text", "scope": "agent"})
    assert not body_conforms(op, form, {"scope": "user"})
