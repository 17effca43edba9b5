"""Who is calling: every request resolves a principal before anything else happens.

* **API keys** — ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``, resolved by
  :class:`tether.keys.ApiKeys` (stored hashed). Two different keys in one request (the two
  headers disagree, or a header is repeated) are refused with a 400: which one would count is
  not something a proxy and the server should be able to disagree on.
* **JWTs** — ``Authorization: Bearer <token>`` when the server has JWT keys configured
  (:mod:`tether.server.tokens`): verified, never looked up; a server with JWT keys has no local
  mode, as one with API keys has none.
* **Local mode** — no API key exists and no JWT key is configured: a request is the principal
  ``local`` if :class:`~tether.server.local_mode.LocalMode` allows it (from this machine, for
  this server's own names, state changes from its own origin only).

Whether any key exists is cached for a second, so keys created by ``tether keys create`` in
another process take effect without a restart; the requests that find it stale together share
one look at the store. A revoked key still counts as existing: revoking
the last key must not quietly reopen the server to callers with no credentials (fail closed).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from tether.errors import Unauthorized
from tether.keys import ApiKeys
from tether.records import LOCAL_PRINCIPAL, Principal
from tether.server.local_mode import LocalMode
from tether.server.problems import Problem
from tether.server.tokens import JwtVerifier, looks_like_jwt

_CACHE_SECONDS = 1.0


class Authenticator:
    def __init__(self, keys: ApiKeys, local: LocalMode, jwt: JwtVerifier | None = None) -> None:
        self._keys = keys
        self._local = local
        self._jwt = jwt
        self._keys_exist: tuple[float, bool] = (0.0, False)
        self._looking: asyncio.Future[bool] | None = None

    async def keys_exist(self) -> bool:
        """Whether callers need credentials: an API key exists, or JWT keys are configured."""
        if self._jwt is not None:
            return True
        checked, exist = self._keys_exist
        if time.monotonic() - checked <= _CACHE_SECONDS:
            return exist
        # One look for everyone who finds the answer stale meanwhile: under load, each
        # request of the second that expired it would read the store otherwise (two reads
        # each while no key exists). Shielded: a caller that goes away ends no one's look.
        looking = self._looking
        if looking is None or looking.get_loop() is not asyncio.get_running_loop():
            looking = self._looking = asyncio.ensure_future(self._look())
            looking.add_done_callback(self._looked)
        return await asyncio.shield(looking)

    async def _look(self) -> bool:
        now = time.monotonic()
        exist = await self._keys.any_exist()
        self._keys_exist = (now, exist)
        return exist

    def _looked(self, looking: asyncio.Future[bool]) -> None:
        if self._looking is looking:
            self._looking = None
        if not looking.cancelled():
            looking.exception()  # retrieved: its waiters may all have gone

    async def resolve(self, request: Request, *, placeholder_keys: bool = False) -> Principal:
        """The caller. ``placeholder_keys`` (the protocol faces): while no API key exists, an
        unknown key is taken for the placeholder an SDK insists on sending (the ``openai``
        SDK will not run without one) and the request is judged by local mode instead."""
        secret = _credential(request)
        if secret is not None and self._jwt is not None and looks_like_jwt(secret):
            return self._jwt.principal(secret)
        if secret is not None:
            try:
                return await self._keys.principal(secret)
            except Unauthorized:
                # With JWT keys configured, credentials are always required. Else asked of
                # the store, not the cache: a key made a moment ago must not let its holder be
                # taken for the local principal.
                if not placeholder_keys or self._jwt is not None:
                    raise
                if await self._keys.any_exist():
                    raise
                self._keys_exist = (time.monotonic(), False)
                self._local.check(request)
                return LOCAL_PRINCIPAL
        if await self.keys_exist():
            wanted = "an API key or a JWT" if self._jwt is not None else "an API key"
            raise Unauthorized(f"{wanted} is required (Authorization: Bearer <key>)")
        self._local.check(request)
        return LOCAL_PRINCIPAL


def _ambiguous(detail: str) -> Problem:
    return Problem(400, "ambiguous-credentials", "Ambiguous credentials", detail)


def _credential(request: Request) -> str | None:
    """The one key the request carries, or None; two different ones are refused."""
    authorization = request.headers.getlist("authorization")
    api_keys = request.headers.getlist("x-api-key")
    if len(authorization) > 1:
        raise _ambiguous("send one Authorization header, not several")
    if len(api_keys) > 1:  # the same rule as Authorization: one header, whatever it holds
        raise _ambiguous("send one X-API-Key header, not several")
    bearer: str | None = None
    if authorization and authorization[0]:
        scheme, _, value = authorization[0].partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <key>'")
        bearer = value.strip()
    key = api_keys[0].strip() if api_keys and api_keys[0].strip() else None
    if bearer is not None and key is not None and bearer != key:
        raise _ambiguous("Authorization and X-API-Key name different keys; send one")
    return bearer or key
