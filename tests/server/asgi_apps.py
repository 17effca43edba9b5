"""``App.asgi()`` for another ASGI server (``uvicorn --factory tests.server.asgi_apps:make``)."""

from __future__ import annotations

from fastapi import FastAPI

from tests.server.apps import app


def make() -> FastAPI:
    """The test agents' ASGI app; settings from ``TETHER_*`` (``TETHER_DATA_DIR`` at least)."""
    return app.asgi()
