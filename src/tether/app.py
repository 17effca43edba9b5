"""``App``: the agents a server runs, and how to serve them (``AgentOS`` is an alias).

::

    from tether import Agent, App
    app = App(agents=[Agent(name="support", instructions="…")])
    app.serve(host="127.0.0.1", port=8000)      # or: tether serve myapp:app
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.agent import Agent
from tether.errors import ConfigError
from tether.server.settings import Settings
from tether.store import open_store_url

if TYPE_CHECKING:
    from fastapi import FastAPI


class App:
    def __init__(self, agents: Iterable[Agent], *, name: str = "tether") -> None:
        self.agents: list[Agent] = list(agents)
        self.name = name
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ConfigError("two agents of one app share a name")

    def asgi(self, settings: Settings | None = None) -> FastAPI:
        """The ASGI application (for uvicorn, gunicorn or tests)."""
        from tether.server.app import create_app

        return create_app(settings or Settings.from_env(), self.agents)

    def serve(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        store: str | None = None,
        data_dir: str | Path | None = None,
        model: str | None = None,
        insecure: bool = False,
        log_level: str = "info",
    ) -> None:
        """Run the server until SIGINT/SIGTERM (blocking)."""
        settings = Settings.from_env(
            host=host,
            port=port,
            store=store,
            data_dir=data_dir,
            model=model,
            insecure=insecure or None,
        )
        serve(settings, self.agents, log_level=log_level)


AgentOS = App


def serve(settings: Settings, agents: Sequence[Agent], *, log_level: str = "info") -> None:
    import uvicorn

    from tether.server.app import create_app

    check_bind(settings)
    app = create_app(settings, agents)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout) + 1,
        access_log=False,
    )


def check_bind(settings: Settings) -> None:
    """Refuse a non-loopback bind with no API keys unless ``insecure`` says so."""
    if settings.loopback or settings.insecure:
        return

    async def count() -> int:
        store = open_store_url(settings.store_url)
        await store.open()
        try:
            return await store.count_api_keys()
        finally:
            await store.close()

    if asyncio.run(count()) == 0:
        raise ConfigError(
            f"refusing to listen on {settings.host}: no API keys exist, so anyone who can reach "
            "this address would have full access. Create one with `tether keys create --user "
            "NAME`, bind to 127.0.0.1, or pass --insecure if that is really what you want."
        )


def load_agents(spec: str) -> list[Agent]:
    """Agents from ``module:attr`` (an App, an Agent or a list of them) or a YAML file."""
    if spec.endswith((".yaml", ".yml")):
        from tether.agents_yaml import load_yaml_agents

        return load_yaml_agents(Path(spec))
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(f"{spec!r}: expected 'module:attribute' or a .yaml file")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    target: Any = getattr(module, attr, None)
    if target is None:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
    if isinstance(target, App):
        return target.agents
    if isinstance(target, Agent):
        return [target]
    if isinstance(target, list | tuple) and all(isinstance(a, Agent) for a in target):
        return list(target)
    raise ConfigError(f"{spec} is a {type(target).__name__}, not an App, Agent or list of agents")
