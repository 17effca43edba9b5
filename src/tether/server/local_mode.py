"""When a request may act as the principal ``local`` (no API key exists): only from this machine,
only for this server's own names, and never changed from another web origin.

Local mode is ambient authority: whoever reaches the socket is the admin ``local``. So,
checked on every request it would serve, whatever ASGI server runs the app:

* **The caller is on this machine.** The client address (the connection's peer) is loopback
  and no proxy header (``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP``) says the request
  came from elsewhere. ``tether serve`` refuses a public bind with no keys before it starts;
  ``App.asgi()`` under uvicorn or gunicorn cannot know the bind, so this check is what keeps
  ``gunicorn -b 0.0.0.0`` closed. ``insecure`` (an explicit choice) lifts it.
* **The Host is ours** (DNS rebinding): a web page on ``evil.example`` whose name is made to
  resolve to 127.0.0.1 reaches the socket with ``Host: evil.example``. A page can never send
  the Host of an IP literal or of ``localhost`` it was not loaded from, so those pass, and so
  do the names in ``allowed_hosts`` (``*``: any).
* **State changes are same-origin.** A cross-site form (a CORS "simple" request, multipart
  uploads included) is sent without any preflight: a POST, PUT, PATCH or DELETE whose
  ``Origin`` is neither this server (scheme aside, the same host and port as ``Host``) nor in
  ``allowed_origins`` is refused. Requests without ``Origin`` (curl, SDKs) pass.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from tether.errors import Unauthorized
from tether.server.problems import Problem

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


@dataclass(frozen=True, slots=True)
class LocalMode:
    insecure: bool = False
    """Serve every caller as ``local``, wherever it connects from (``--insecure``)."""
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def check(self, request: Request) -> None:
        """Raise unless ``request`` may act as the local principal."""
        if not self.insecure and not from_this_machine(request):
            raise Unauthorized(
                "an API key is required (Authorization: Bearer <key>): with no keys, only "
                "callers on this machine are served"
            )
        host = request.headers.get("host")
        if host is not None and not self.host_allowed(host):
            raise Problem(
                403,
                "host-not-allowed",
                "Host not allowed",
                "with no API keys, the server answers only to localhost, an IP address or a "
                "name in TETHER_ALLOWED_HOSTS",
            )
        if request.method not in SAFE_METHODS and not self.origin_allowed(request, host):
            raise Problem(
                403,
                "origin-not-allowed",
                "Origin not allowed",
                "with no API keys, another web origin may not change anything; allow it with "
                "TETHER_ALLOWED_ORIGINS",
            )

    def host_allowed(self, host: str) -> bool:
        name = hostname(host)
        if name is None:
            return False
        if name == "localhost" or name.endswith(".localhost") or _is_ip(name):
            return True
        allowed = {h.lower().rstrip(".") for h in self.allowed_hosts}
        return "*" in allowed or name in allowed

    def origin_allowed(self, request: Request, host: str | None) -> bool:
        origin = request.headers.get("origin")
        if origin is None:
            # No Origin: not a browser, or a browser too old to say; a modern one sends it on
            # every cross-origin request it makes, so this is the only cross-site tell left.
            return request.headers.get("sec-fetch-site") not in ("cross-site", "same-site")
        origin = origin.strip().lower().rstrip("/")
        allowed = {o.strip().lower().rstrip("/") for o in self.allowed_origins}
        if "*" in allowed or origin in allowed:
            return True
        parts = urlsplit(origin)
        # "null" (sandboxed frames, file: pages) has no netloc and is never same-origin.
        return bool(parts.netloc) and host is not None and parts.netloc == host.strip().lower()


def from_this_machine(request: Request) -> bool:
    client = request.client
    if client is None or not _is_loopback(client.host):
        return False
    return not any(name in request.headers for name in _PROXY_HEADERS)


def hostname(host: str) -> str | None:
    """The name of a ``Host`` header without its port, lowercased; None if malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else None
    name, _, port = host.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


# Both are asked on every request of local mode, nearly always of the same few strings (the
# loopback peer, the Host's name): parsing an address each time was ~2 % of a turn's CPU.
@functools.lru_cache(maxsize=1024)
def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
