"""API keys: minted once, stored hashed, resolved to a principal.

Keys are 192 random bits behind a ``tk_<id>_`` prefix; the store keeps only their SHA-256 (a
slow password hash buys nothing for random keys). The server's authentication
(:mod:`tether.server.auth`) and the ``tether keys`` commands both go through :class:`ApiKeys`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from tether.errors import ConfigError, Unauthorized
from tether.records import LOCAL_PRINCIPAL, ApiKey, Principal
from tether.store.protocol import KeyStore

KEY_PREFIX = "tk_"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewKey:
    record: ApiKey
    secret: str
    """Shown once; only its hash is stored."""


def check_name(label: str, value: str) -> str:
    """A principal is a namespace: an empty, blank or unprintable name would be a shared,
    unnamed one."""
    if not value or len(value) > 128 or not value.isprintable() or any(c.isspace() for c in value):
        raise ConfigError(f"{label} must be 1-128 printable characters without spaces")
    return value


def check_tenant(tenant: str) -> str:
    """A key's tenant: a name (see :func:`check_name`), and never the one local mode and
    embedded scripts use: a key in it would read and write as they do."""
    check_name("tenant", tenant)
    if tenant == LOCAL_PRINCIPAL.tenant:
        raise ConfigError(
            f"the tenant {tenant!r} is reserved for local mode and embedded scripts; keys "
            "cannot act in it (pick another tenant, e.g. the default)"
        )
    return tenant


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


class ApiKeys:
    def __init__(self, store: KeyStore) -> None:
        self._store = store

    async def create(self, user: str, tenant: str = "default", *, admin: bool = False) -> NewKey:
        """A new key for ``tenant``/``user``, stored hashed; its secret is in the result only."""
        new = mint_key(check_name("user", user), check_tenant(tenant), admin=admin)
        await self._store.create_api_key(new.record)
        return new

    async def list(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first (hashes, never secrets)."""
        return await self._store.list_api_keys()

    async def revoke(self, key_id: str) -> bool:
        """False when there is no such active key."""
        return await self._store.revoke_api_key(key_id)

    async def count_active(self) -> int:
        """Keys that are not revoked."""
        return await self._store.count_api_keys()

    async def any_exist(self) -> bool:
        """True once any key was ever created: revoking the last key must not quietly reopen a
        server to callers with no credentials (fail closed)."""
        # Active keys are counted cheaply; only when there are none do we look for revoked
        # ones (a short list: the no-active-key case).
        return await self._store.count_api_keys() > 0 or len(await self._store.list_api_keys()) > 0

    async def principal(self, secret: str) -> Principal:
        """Who ``secret`` acts as; Unauthorized for an unknown, malformed or revoked key."""
        if not secret.startswith(KEY_PREFIX):
            raise Unauthorized("invalid API key")
        digest = hash_key(secret)
        record = await self._store.api_key_by_hash(digest)
        if record is None or record.revoked_at is not None:
            raise Unauthorized("invalid or revoked API key")
        if not hmac.compare_digest(record.hash, digest):
            raise Unauthorized("invalid API key")
        if record.tenant == LOCAL_PRINCIPAL.tenant:
            # Made before the tenant was reserved (or written to the store by hand).
            raise Unauthorized("this API key's tenant is reserved for local mode; make a new key")
        return Principal(record.tenant, record.user, record.roles)
