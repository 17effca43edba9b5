"""JWTs as credentials (DESIGN §2, §11): verified against the keys the server is given, mapped
to a principal from their claims, refused with a 401 that says why; no local mode beside them.

Before, a JWT was refused as an unknown API key: the contract's "resolved from an API key or
JWT" held for keys only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from tests.server.cli_keys import assert_problem, create_key
from tests.server.conftest import Server, ServerFactory, start_server
from tether.errors import ConfigError
from tether.server.tokens import JwtSettings

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


def token(claims: dict[str, Any] | None = None, *, key: Any = SECRET, alg: str = "HS256") -> str:
    body = {"sub": "alice", "exp": int(time.time()) + 300, **(claims or {})}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=alg)


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    env = {"TETHER_JWT_SECRET": SECRET, "TETHER_JWT_AUDIENCE": "tether-test"}
    srv = start_server(tmp_path_factory.mktemp("jwt") / "data", env=env)
    yield srv
    srv.stop()


def aud(claims: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"aud": "tether-test", **(claims or {})}


@pytest.mark.slow
def test_a_tokens_subject_and_tenant_are_the_principal(server: Server) -> None:
    alice, bob = token(aud()), token(aud({"sub": "bob"}))
    other_tenant = token(aud({"tenant": "acme"}))
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/api/chat", json={"message": "hi", "session_id": "mine"}, headers=bearer(alice))
        assert r.status_code == 200, r.text
        assert c.get("/v1/sessions/mine", headers=bearer(alice)).status_code == 200
        # The same session id is another principal's namespace: a 404, never Alice's.
        for stranger in (bob, other_tenant):
            assert_problem(c.get("/v1/sessions/mine", headers=bearer(stranger)), 404)
        r = c.post("/api/chat", json={"message": "yo", "session_id": "mine"}, headers=bearer(bob))
        assert r.json()["response"] == "saw [] then yo"  # Bob's own, fresh
        listed = c.get("/v1/sessions", headers=bearer(alice)).json()["data"]
        assert [s["session_id"] for s in listed] == ["mine"]
        # Roles come from the roles claim: only an admin writes tenant-wide memory.
        fact = {"content": "The office opens at nine.", "scope": "tenant"}
        assert_problem(c.post("/v1/memory", json=fact, headers=bearer(alice)), 403)
        admin = token(aud({"roles": ["admin"]}))
        assert c.post("/v1/memory", json=fact, headers=bearer(admin)).status_code == 201
    # Other doors take the same token: the OpenAI SDK sends it as its API key.
    with openai.OpenAI(base_url=server.url + "/v1", api_key=alice, max_retries=0) as sdk:
        assert [m.id for m in sdk.models.list().data][:1] == ["echo"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("claims", "key", "alg", "says"),
    [
        ({"exp": int(time.time()) - 3600}, SECRET, "HS256", "expired"),
        ({}, SECRET.upper(), "HS256", "signature"),
        ({"aud": "someone-else"}, SECRET, "HS256", "audience"),
        ({"exp": None}, SECRET, "HS256", "'exp'"),
        ({"sub": None}, SECRET, "HS256", "'sub'"),
        ({"tenant": "local"}, SECRET, "HS256", "reserved"),
        ({"roles": "admin"}, SECRET * 2, "HS384", "algorithm"),
        ({}, None, "none", "algorithm"),
    ],
)
def test_a_token_that_does_not_verify_is_a_401_saying_why(
    server: Server, claims: dict[str, Any], key: Any, alg: str, says: str
) -> None:
    bad = token(aud(claims) if "aud" not in claims else claims, key=key, alg=alg)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/v1/sessions", headers=bearer(bad))
        assert_problem(r, 401, "unauthorized")
        assert says in r.json()["detail"], r.json()
        assert r.headers["www-authenticate"].startswith("Bearer")
        # Nor is anyone local: with JWT keys there is no local mode.
        assert_problem(c.get("/v1/sessions"), 401)
        r = c.post("/api/chat", json={"message": "hi", "session_id": "anon"})
        assert_problem(r, 401)


@pytest.mark.slow
def test_api_keys_work_beside_tokens_and_a_public_address_needs_no_insecure(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    # An EC public key from a file: the issuer keeps the private one.
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "issuer.pem").write_bytes(pem)
    env = {"TETHER_JWT_PUBLIC_KEY": str(tmp_path / "issuer.pem"), "TETHER_JWT_ISSUER": "idp"}
    srv = make_server("--host", "0.0.0.0", env=env)  # no API key, no --insecure: it starts
    key = create_key(srv.data_dir, "carol")
    signed = token({"iss": "idp", "sub": "carol"}, key=private, alg="ES256")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        body = {"message": "hi", "session_id": "both"}
        assert c.post("/api/chat", json=body, headers=bearer(signed)).status_code == 200
        # The API key of the same tenant and user is the same principal.
        assert c.get("/v1/sessions/both", headers=bearer(key.secret)).status_code == 200
        r = c.get("/v1/sessions", headers=bearer(token({"iss": "idp"}, key=private, alg="ES256")))
        assert r.status_code == 200  # alice: signed right, another user, nothing of Carol's
        assert r.json()["data"] == []
        wrong_issuer = token({"iss": "elsewhere"}, key=private, alg="ES256")
        assert_problem(c.get("/v1/sessions", headers=bearer(wrong_issuer)), 401)
        # An HMAC token is refused where a public key verifies: the algorithms are pinned,
        # and so are tokens of another key family (they were a 500: InvalidKeyError).
        others = [
            token({"iss": "idp", "sub": "carol"}, key=SECRET, alg="HS256"),
            token({"iss": "idp"}, key=_rsa(), alg="RS256"),
            token({"iss": "idp"}, key=ed25519.Ed25519PrivateKey.generate(), alg="EdDSA"),
            token({"iss": "idp"}, key=ec.generate_private_key(ec.SECP384R1()), alg="ES384"),
        ]
        for forged in others:
            r = c.get("/v1/sessions", headers=bearer(forged))
            assert_problem(r, 401)
            assert "algorithm" in r.json()["detail"]


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _public_pem(private: Any) -> str:
    return str(
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def test_bad_jwt_settings_stop_the_start() -> None:
    for env, says in [
        ({"TETHER_JWT_SECRET": "short"}, "at least 32 bytes"),
        ({"TETHER_JWT_SECRET": SECRET, "TETHER_JWT_PUBLIC_KEY": "x"}, "not both"),
        ({"TETHER_JWT_PUBLIC_KEY": "/no/such/file.pem"}, "cannot read"),
        ({"TETHER_JWT_PUBLIC_KEY": "-----BEGIN PUBLIC KEY-----\nnope"}, "not a PEM"),
        ({"TETHER_JWT_SECRET": SECRET, "TETHER_JWT_ALGORITHMS": "RS256"}, "cannot be used"),
        ({"TETHER_JWT_SECRET": SECRET, "TETHER_JWT_ALGORITHMS": "none"}, "cannot be used"),
        ({"TETHER_JWT_SECRET": SECRET, "TETHER_JWT_ALGORITHMS": "HS512"}, "at least 64 bytes"),
    ]:
        with pytest.raises(ConfigError, match=says):
            JwtSettings.from_env(env)
    assert JwtSettings.from_env({}) is None
    # The algorithms follow the key: a P-384 key verifies ES384 (it was offered ES256 alone).
    for private, algorithms in [
        (ec.generate_private_key(ec.SECP384R1()), ("ES384",)),
        (ec.generate_private_key(ec.SECP521R1()), ("ES512",)),
        (_rsa(), ("RS256",)),
        (ed25519.Ed25519PrivateKey.generate(), ("EdDSA",)),
    ]:
        settings = JwtSettings.from_env({"TETHER_JWT_PUBLIC_KEY": _public_pem(private)})
        assert settings is not None and settings.algorithms == algorithms
    rsa_pem = _public_pem(_rsa())
    with pytest.raises(ConfigError, match="cannot be used with an RSA key"):
        JwtSettings.from_env({"TETHER_JWT_PUBLIC_KEY": rsa_pem, "TETHER_JWT_ALGORITHMS": "ES256"})
