"""The server's listening socket, bound before the server says it is serving.

uvicorn binds only after the app has started, and a taken port is then one log line among
others after "serving … on http://…" was already printed. Binding first makes a taken port a
plain error, before any store is opened, that says what to do about it.
"""

from __future__ import annotations

import errno
import socket

from tether.errors import ConfigError


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; a :class:`ConfigError` when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # create_server sets SO_REUSEADDR (POSIX), as uvicorn does: a restart is not refused
        # for the previous process's connections in TIME_WAIT.
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"cannot listen on {where}: the address is already in use (another server is "
                f"running there). Pick another port with --port {_another(port)} "
                f"(or TETHER_PORT={_another(port)}), or stop the other server."
            ) from None
        raise ConfigError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    """The URL a client reaches the socket at (its real port, when port 0 was asked for)."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _another(port: int) -> int:
    return port + 1 if 0 < port < 65535 else 8001
