"""The server's logging: what ``tether serve`` (and ``App.serve``) prints, configured in one place.

uvicorn's own configuration leaves the root logger alone, so a library that configures it on
import (``wordllama`` calls ``logging.basicConfig(level=INFO)``) decided what the server log
held: every request tether made to a model provider became an ``INFO:httpx…`` line. Here the
server owns it: tether's and uvicorn's lines at the chosen level, one access line per request
unless it is turned off, and everything else (libraries) at warnings and above only.
"""

from __future__ import annotations

from typing import Any


def log_config(level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn's ``log_config`` (which applies it).

    uvicorn keeps the names ``default`` and ``access`` of the formatters (it sets their colours),
    and turns the access log off itself when asked (``access_log=False``).
    """
    named = level.upper()  # "TRACE" too: uvicorn names that level before applying this
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s %(message)s",
                "use_colors": None,
            },
            "named": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s %(name)s: %(message)s",
                "use_colors": None,
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            },
        },
        "handlers": {
            "default": {
                "formatter": "default",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
            "named": {
                "formatter": "named",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
            "access": {
                "formatter": "access",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": named, "propagate": False},
            "uvicorn.error": {"level": named},
            "uvicorn.access": {"handlers": ["access"], "level": named, "propagate": False},
            "tether": {"handlers": ["named"], "level": named, "propagate": False},
        },
        # Libraries' records (httpx's request lines are INFO) only when they matter.
        "root": {"handlers": ["named"], "level": "WARNING"},
    }
