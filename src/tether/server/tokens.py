"""JSON Web Tokens as credentials (DESIGN §2, §11): verified against keys the operator
configures, never fetched, and mapped to a principal from their claims.

``TETHER_JWT_SECRET`` (HMAC, at least 32 bytes) or ``TETHER_JWT_PUBLIC_KEY`` (a PEM public key,
or the path of a file holding one: RSA, EC or Ed25519) turns them on. A token must be signed
with one of the algorithms allowed (``TETHER_JWT_ALGORITHMS``, among those of the key's kind;
by default HS256 for a secret, RS256 for an RSA key, the curve's ES algorithm for an EC key,
EdDSA for an Ed25519 one; never ``none``), carry ``sub`` (the user) and ``exp`` (30 s of clock
skew allowed),
and match ``TETHER_JWT_AUDIENCE`` and ``TETHER_JWT_ISSUER`` when they are set. The tenant is
the ``tenant`` claim (``TETHER_JWT_TENANT_CLAIM``; ``default`` when absent), the roles the
``roles`` claim (``TETHER_JWT_ROLES_CLAIM``: a list, or one space-separated string); ``admin``
among them is what an admin API key is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from tether.errors import ConfigError, Unauthorized
from tether.keys import check_name, check_tenant
from tether.records import Principal

MIN_SECRET_BYTES = 32
"""RFC 7518 §3.2: an HMAC key at least as long as the hash (HS256: 32 bytes)."""
LEEWAY_SECONDS = 30.0
"""Clock skew allowed for ``exp``, ``nbf`` and ``iat`` between the issuer and this server."""
DEFAULT_TENANT = "default"

_HMAC = ("HS256", "HS384", "HS512")
# Three base64url parts, the first a JSON object ('{"' encodes as "eyJ"): what a token looks
# like; tether's own API keys ("tk_…") never do.
_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def looks_like_jwt(credential: str) -> bool:
    return _SHAPE.fullmatch(credential) is not None


@dataclass(frozen=True, slots=True)
class JwtSettings:
    key: str
    """The HMAC secret, or the PEM text of the public key."""
    algorithms: tuple[str, ...]
    audience: str | None = None
    issuer: str | None = None
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JwtSettings | None:
        secret = env.get("TETHER_JWT_SECRET", "")
        public = env.get("TETHER_JWT_PUBLIC_KEY", "").strip()
        if not secret and not public:
            return None
        if secret and public:
            raise ConfigError("set TETHER_JWT_SECRET or TETHER_JWT_PUBLIC_KEY, not both")
        allowed: tuple[str, ...]
        default: tuple[str, ...]
        if secret:
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"TETHER_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes (256 bits)"
                )
            key, kind, allowed, default = secret, "TETHER_JWT_SECRET", _HMAC, ("HS256",)
        else:
            key, kind, allowed, default = _public_key(public)
        raw = env.get("TETHER_JWT_ALGORITHMS", "")
        algorithms = tuple(a.strip() for a in raw.split(",") if a.strip()) or default
        wrong = [a for a in algorithms if a not in allowed]
        if wrong:
            raise ConfigError(
                f"TETHER_JWT_ALGORITHMS: {', '.join(wrong)} cannot be used with {kind} "
                f"(use {', '.join(allowed)})"
            )
        # RFC 7518 §3.2: an HMAC key at least as long as its hash's output.
        needed = max((int(a[2:]) // 8 for a in algorithms if a in _HMAC), default=0)
        if secret and len(secret.encode()) < needed:
            raise ConfigError(f"TETHER_JWT_SECRET must be at least {needed} bytes for {raw}")
        return cls(
            key=key,
            algorithms=algorithms,
            audience=env.get("TETHER_JWT_AUDIENCE") or None,
            issuer=env.get("TETHER_JWT_ISSUER") or None,
            tenant_claim=env.get("TETHER_JWT_TENANT_CLAIM") or "tenant",
            roles_claim=env.get("TETHER_JWT_ROLES_CLAIM") or "roles",
        )


def _public_key(value: str) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """(PEM text, what it is, the algorithms it can verify, the default ones) of the PEM text
    ``value`` or of the file it names; checked now, so a bad key stops the start rather than
    refusing every request, and a token of another family is refused as such."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = value
    if "-----BEGIN" not in value:
        try:
            text = Path(value).read_text()
        except OSError as exc:
            raise ConfigError(f"TETHER_JWT_PUBLIC_KEY: cannot read {value!r}: {exc}") from None
    try:
        key = load_pem_public_key(text.encode())
    except ValueError:
        raise ConfigError(
            "TETHER_JWT_PUBLIC_KEY is not a PEM public key (-----BEGIN PUBLIC KEY-----)"
        ) from None
    if isinstance(key, rsa.RSAPublicKey):
        rsa_algorithms = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
        return text, "an RSA key", rsa_algorithms, ("RS256",)
    if isinstance(key, ec.EllipticCurvePublicKey):
        curve = _CURVES.get(key.curve.name)
        if curve is None:
            raise ConfigError(f"TETHER_JWT_PUBLIC_KEY: JWTs do not use the curve {key.curve.name}")
        return text, f"an EC {key.curve.name} key", (curve,), (curve,)
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return text, "an EdDSA key", ("EdDSA",), ("EdDSA",)
    raise ConfigError("TETHER_JWT_PUBLIC_KEY: use an RSA, EC or Ed25519 public key")


_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
"""RFC 7518 §3.4: each ES algorithm is one curve's."""


class JwtVerifier:
    """Tokens to principals, under one :class:`JwtSettings`."""

    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings

    def principal(self, token: str) -> Principal:
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                s.key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "sub"], "verify_aud": s.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("the token is not valid yet (nbf or iat)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"the token has no {exc.claim!r} claim") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("the token is for another audience (aud)") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token is from another issuer (iss)") from None
        except jwt.InvalidAlgorithmError:
            allowed = ", ".join(s.algorithms)
            raise Unauthorized(f"the token's algorithm is not accepted (use {allowed})") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("the token's signature does not verify") from None
        except (jwt.InvalidTokenError, jwt.InvalidKeyError):
            # InvalidKeyError: a key of another kind than the token's algorithm wants (the
            # algorithms are the key's own, so only a misconfigured list gets here).
            raise Unauthorized("the token is malformed") from None
        return _principal(claims, s)


def _principal(claims: dict[str, Any], s: JwtSettings) -> Principal:
    user, tenant = claims.get("sub"), claims.get(s.tenant_claim, DEFAULT_TENANT)
    if not isinstance(user, str) or not isinstance(tenant, str):
        raise Unauthorized(f"the token's sub and {s.tenant_claim} claims must be strings")
    try:
        check_name("user", user)
        check_tenant(tenant)
    except ConfigError as exc:
        raise Unauthorized(f"the token's principal is refused: {exc}") from None
    roles = claims.get(s.roles_claim, ())
    if isinstance(roles, str):
        roles = roles.split()
    if not isinstance(roles, list | tuple) or not all(isinstance(r, str) for r in roles):
        raise Unauthorized(f"the token's {s.roles_claim} claim must be a list of strings")
    return Principal(tenant, user, frozenset(roles))
