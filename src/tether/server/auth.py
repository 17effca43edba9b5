"""Who is calling: every request resolves a principal before anything else happens.

* **Local mode** — no API key exists and the server is bound to a loopback address: every
  request is the principal ``local``.
* **API keys** — ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. Keys are 192 random
  bits; the store keeps only their SHA-256 (a slow password hash buys nothing for random keys).

Whether any key exists is cached for a second, so keys created by ``tether keys create`` in
another process take effect without a restart. A revoked key still counts as existing: revoking
the last key must not quietly reopen the server to callers with no credentials (fail closed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from fastapi import Request

from tether.errors import Unauthorized
from tether.records import LOCAL_PRINCIPAL, ApiKey, Principal
from tether.store.protocol import Store

KEY_PREFIX = "tk_"
_CACHE_SECONDS = 1.0


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewKey:
    record: ApiKey
    secret: str
    """Shown once; only its hash is stored."""


def mint_key(user: str, tenant: str = "default", *, admin: bool = False) -> NewKey:
    key_id = secrets.token_hex(4)
    secret = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(24)}"
    roles = frozenset({"admin"}) if admin else frozenset()
    record = ApiKey(
        id=key_id,
        tenant=tenant,
        user=user,
        roles=roles,
        hash=hash_key(secret),
        created_at=time.time(),
        revoked_at=None,
    )
    return NewKey(record, secret)


class Authenticator:
    def __init__(self, store: Store, *, local_allowed: bool) -> None:
        self._store = store
        self._local_allowed = local_allowed
        self._keys_exist: tuple[float, bool] = (0.0, False)

    async def keys_exist(self) -> bool:
        checked, exist = self._keys_exist
        now = time.monotonic()
        if now - checked > _CACHE_SECONDS:
            # Active keys are counted cheaply; only when there are none do we look for
            # revoked ones (a short list: the no-active-key case).
            exist = (
                await self._store.count_api_keys() > 0 or len(await self._store.list_api_keys()) > 0
            )
            self._keys_exist = (now, exist)
        return exist

    async def resolve(self, request: Request) -> Principal:
        secret = _credential(request)
        if secret is None:
            if self._local_allowed and not await self.keys_exist():
                return LOCAL_PRINCIPAL
            raise Unauthorized("an API key is required (Authorization: Bearer <key>)")
        if not secret.startswith(KEY_PREFIX):
            raise Unauthorized("invalid API key")
        digest = hash_key(secret)
        record = await self._store.api_key_by_hash(digest)
        if record is None or record.revoked_at is not None:
            raise Unauthorized("invalid or revoked API key")
        if not hmac.compare_digest(record.hash, digest):
            raise Unauthorized("invalid API key")
        return Principal(record.tenant, record.user, record.roles)


def _credential(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise Unauthorized("the Authorization header must be 'Bearer <key>'")
    key = request.headers.get("x-api-key")
    return key.strip() if key else None
