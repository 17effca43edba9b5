"""Who is calling: every request resolves a principal before anything else happens.

* **Local mode** — no API key exists and the server is bound to a loopback address: every
  request is the principal ``local``.
* **API keys** — ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``, resolved by
  :class:`tether.keys.ApiKeys` (stored hashed).

Whether any key exists is cached for a second, so keys created by ``tether keys create`` in
another process take effect without a restart. A revoked key still counts as existing: revoking
the last key must not quietly reopen the server to callers with no credentials (fail closed).
"""

from __future__ import annotations

import time

from fastapi import Request

from tether.errors import Unauthorized
from tether.keys import ApiKeys
from tether.records import LOCAL_PRINCIPAL, Principal

_CACHE_SECONDS = 1.0


class Authenticator:
    def __init__(self, keys: ApiKeys, *, local_allowed: bool) -> None:
        self._keys = keys
        self._local_allowed = local_allowed
        self._keys_exist: tuple[float, bool] = (0.0, False)

    async def keys_exist(self) -> bool:
        checked, exist = self._keys_exist
        now = time.monotonic()
        if now - checked > _CACHE_SECONDS:
            exist = await self._keys.any_exist()
            self._keys_exist = (now, exist)
        return exist

    async def resolve(self, request: Request) -> Principal:
        secret = _credential(request)
        if secret is None:
            if self._local_allowed and not await self.keys_exist():
                return LOCAL_PRINCIPAL
            raise Unauthorized("an API key is required (Authorization: Bearer <key>)")
        return await self._keys.principal(secret)


def _credential(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise Unauthorized("the Authorization header must be 'Bearer <key>'")
    key = request.headers.get("x-api-key")
    return key.strip() if key else None
