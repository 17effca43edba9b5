"""``App``: the agents a server runs, and how to serve them (``AgentOS`` is an alias).

::

    from tether import Agent, App
    app = App(agents=[Agent(name="support", instructions="…")])
    app.serve(host="127.0.0.1", port=8000)      # or: tether serve myapp:app
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import math
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from tether import affinity
from tether.affinity import Pinned
from tether.agent import Agent
from tether.errors import ConfigError
from tether.keys import ApiKeys
from tether.server.settings import Settings
from tether.store import open_store_url

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from tether.runtime import Runtime
    from tether.scheduler import Scheduler

log = logging.getLogger("tether.server")


class App:
    def __init__(self, agents: Iterable[Agent], *, name: str = "tether") -> None:
        if isinstance(agents, Agent) or not isinstance(agents, Iterable):
            raise ConfigError("App(agents=[...]) takes a list of agents")
        given = list(agents)
        for a in given:
            if not isinstance(a, Agent):
                raise ConfigError(f"App(agents=[...]): {a!r} is not an Agent")
        # The agents they hand off to are served too (a transfer must find its target), after
        # the ones given: the first given agent stays the app's default.
        self.agents: list[Agent] = list(
            {id(a): a for g in given for a in (g, *g.handoff_agents())}.values()
        )
        self.name = name
        names = [a.name for a in self.agents]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two agents of one app share the name {twice[0]!r}")
        for agent in self.agents:
            for h in agent.handoffs:
                if h.agent_name not in names:
                    raise ConfigError(
                        f"agent {agent.name} hands off to {h.agent_name!r}, which this app does "
                        f"not serve; add it to the app's agents"
                    )

    def asgi(self, settings: Settings | None = None) -> FastAPI:
        """The ASGI application (for uvicorn, gunicorn or tests).

        It fails closed as ``serve`` does, though it cannot know what the ASGI server binds:
        with no API keys, each request is checked instead (see :mod:`tether.server.local_mode`)
        and only callers on this machine are served, unless ``settings.insecure``. In-process
        clients count as what they claim: httpx's ``ASGITransport`` is 127.0.0.1 (name the
        base URL ``http://127.0.0.1``), Starlette's ``TestClient`` is remote ("testclient" at
        "testserver": give it a key, or ``Settings(insecure=True,
        allowed_hosts=("testserver",))``). The bound ``serve`` puts on request heads is the ASGI
        server's business here: uvicorn (gunicorn's uvicorn workers too) has one only with
        ``--http h11`` (16 KiB by default).
        """
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
        drain_timeout: float | None = None,
        workers: int | None = None,
        log_level: str = "info",
        access_log: bool = True,
    ) -> None:
        """Run the server until SIGINT/SIGTERM (blocking); then running turns get
        ``drain_timeout`` seconds (default 10) to finish before they are cancelled.

        ``workers`` (default 1, or ``TETHER_WORKERS``) processes share the port and the store;
        they are forked from this one, so agents defined in ``__main__`` are served too."""
        settings = Settings.from_env(
            host=host,
            port=port,
            store=store,
            data_dir=data_dir,
            model=model,
            insecure=insecure or None,
            drain_timeout=drain_timeout,
            workers=workers,
        )
        agents = self.agents

        def announce(url: str) -> None:  # as `tether serve` says it: where to point a client
            print(ready_line(agents, settings, url), file=sys.stderr, flush=True)

        serve(settings, agents, log_level=log_level, access_log=access_log, on_ready=announce)


AgentOS = App


def ready_line(agents: Sequence[Agent], settings: Settings, url: str) -> str:
    """What a server says once it listens: its agents, its URL and its store (no password)."""
    from tether.redact import redact_url

    names = ", ".join(a.name for a in agents)
    store = redact_url(settings.store_url)
    if settings.workers > 1:
        store += f", {settings.workers} workers"
    return f"tether: serving {names} on {url} (store {store})"


def serve(
    settings: Settings,
    agents: Sequence[Agent],
    *,
    log_level: str = "info",
    access_log: bool = True,
    on_ready: Callable[[str], object] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain: running turns get ``drain_timeout`` seconds to
    finish and are then cancelled (reason ``shutdown``); the process exits 0.

    ``on_ready(url)`` is called once the socket listens and the app has started (with
    ``settings.workers`` above 1: once every worker has); a port that is taken is a
    :class:`ConfigError` before anything starts."""
    from tether.models.openai import transport_asked
    from tether.server.listen import listen_socket, url_of

    check_bind(settings)
    transport_asked()  # a bad TETHER_OPENAI_TRANSPORT stops the start, not the first turn
    if settings.workers > 1:
        from tether.server import workers

        workers.check_workers(settings)
    sock = listen_socket(settings.host, settings.port)
    with sock:
        if settings.workers == 1:
            from tether.server.workers import prepare_store

            # A store that cannot be opened is one line and exit 3, as with workers (inside
            # the app's start, uvicorn would print it as two tracebacks).
            prepare_store(settings.store_url)
            ready = None if on_ready is None else lambda: on_ready(url_of(sock, settings.host))
            _serve_on(sock, settings, agents, log_level, access_log, ready)
            return
        _serve_workers(sock, settings, agents, log_level, access_log, on_ready)


def _serve_on(
    sock: socket.socket,
    settings: Settings,
    agents: Sequence[Agent],
    log_level: str,
    access_log: bool,
    on_ready: Callable[[], object] | None,
    *,
    handed: bool = False,
) -> None:
    """One server in this process on the listening ``sock``: the whole of ``serve`` with one
    worker, and each worker's life with several, where ``sock`` (``handed``) is the channel on
    which the parent hands the worker its connections (:mod:`tether.server.handed`)."""
    import uvicorn

    from tether.models.openai import use_server_transport
    from tether.server.app import create_app
    from tether.server.head_limit import head_limited
    from tether.server.log_config import log_config

    use_server_transport()  # one loop for the process's life: see its docstring
    app = create_app(settings, agents)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=log_config(log_level),
        log_level=log_level,
        http=head_limited(settings.limits.max_header_bytes),
        # Streams of running turns end once the drain has ended their turns; this bound only
        # cuts the ones that cannot end here (turns queued behind them, or run elsewhere).
        timeout_graceful_shutdown=_graceful_bound(settings),
        access_log=access_log,
    )
    server = _draining_server(
        config, app.state.tether.runtime.scheduler, settings.drain_timeout, handed=handed
    )
    server.on_ready = on_ready
    server.pin = _pinning(settings, app.state.tether.runtime)
    with _sigterm_exits_cleanly(), contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE (it has logged why)


def _graceful_bound(settings: Settings) -> int:
    """Seconds a stopping server waits for open connections: the drain, then a little for the
    streams of the turns it ended to send their last events."""
    return math.ceil(settings.drain_timeout) + 6


def _serve_workers(
    sock: socket.socket,
    settings: Settings,
    agents: Sequence[Agent],
    log_level: str,
    access_log: bool,
    on_ready: Callable[[str], object] | None,
) -> None:
    """``settings.workers`` processes on ``sock``, supervised from this one."""
    import logging.config

    # Imported here, once, rather than by each worker after the fork.
    import uvicorn  # noqa: F401

    from tether.server import app as server_app  # noqa: F401
    from tether.server import workers
    from tether.server.listen import url_of
    from tether.server.log_config import log_config

    logging.config.dictConfig(log_config(log_level))  # the supervisor's own lines
    workers.prepare_store(settings.store_url)
    url = url_of(sock, settings.host)
    supervisor = workers.Supervisor(
        settings,
        sock,
        lambda worker_settings, ready, channel: _serve_on(
            channel, worker_settings, agents, log_level, access_log, ready, handed=True
        ),
        on_ready=None if on_ready is None else lambda: on_ready(url),
        stop_within=_graceful_bound(settings) + workers.STOP_GRACE,
    )
    code = supervisor.run()
    if code:
        raise SystemExit(code)


def _draining_server(
    config: uvicorn.Config, scheduler: Scheduler, drain_timeout: float, *, handed: bool = False
) -> Any:
    from tether.server.quiet import QuietServer

    class DrainingServer(QuietServer):
        """Starts draining the scheduler the moment shutdown begins.

        uvicorn first waits for open connections, and only then runs the app's lifespan
        shutdown (which drains the scheduler). An SSE stream of a running turn stays open until
        its turn ends, so without this the server would sit out its whole grace period before
        even asking the turn to stop, and cut the client off without the turn's terminal event.
        """

        on_ready: Callable[[], object] | None = None
        pin: Callable[[], Awaitable[Pinned | None]] | None = None
        pinned: Pinned | None = None
        pinning: asyncio.Future[None] | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            from tether.server import heap

            if handed and sockets:
                await self._startup_handed(sockets)
            else:
                await super().startup(sockets)
            # The app has started: what it made lives as long as the process. A server run in
            # another thread shares its process with code of its own (a test, an application),
            # whose collector is not ours to set.
            if self.started and threading.current_thread() is threading.main_thread():
                heap.settle()
                # The same goes for the CPUs its threads run on.
                if self.pin is not None:
                    self.pinning = asyncio.ensure_future(self._pin(self.pin))
            if self.started and self.on_ready is not None:
                self.on_ready()

        async def _pin(self, pin: Callable[[], Awaitable[Pinned | None]]) -> None:
            self.pinned = pinned = await pin()
            while pinned is not None:
                await asyncio.sleep(SWEEP_EVERY)
                pinned.sweep()

        async def _startup_handed(self, channels: list[socket.socket]) -> None:
            """uvicorn's startup with no listener of its own, then a
            :class:`~tether.server.handed.Handed` a channel, making for each connection the
            protocol uvicorn's listener makes (its ``create_protocol``)."""
            from tether.server.handed import Handed

            await super().startup([])
            if not self.started:
                return
            loop = asyncio.get_running_loop()
            config, server_state, app_state = self.config, self.server_state, self.lifespan.state

            def protocol() -> asyncio.Protocol:
                return config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=server_state, app_state=app_state, _loop=loop
                )

            listeners = [Handed(loop, channel, protocol) for channel in channels]
            for listener in listeners:
                listener.start()
            # uvicorn calls close() and wait_closed() on its servers, which a Handed has.
            self.servers = cast("list[asyncio.base_events.Server]", listeners)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # The lifespan's own close() joins this one: both wait for the same worker tasks.
            draining = asyncio.ensure_future(scheduler.close(drain_timeout))
            try:
                await super().shutdown(sockets)
            finally:
                await asyncio.gather(draining, return_exceptions=True)
                if self.pinning is not None:
                    self.pinning.cancel()
                    await asyncio.gather(self.pinning, return_exceptions=True)
                if self.pinned is not None:
                    self.pinned.undo()

    return DrainingServer(config)


SWEEP_EVERY = 10.0
"""Seconds between looks for threads that native code started on the pinned CPU."""


def _pinning(settings: Settings, runtime: Runtime) -> Callable[[], Awaitable[Pinned | None]] | None:
    """What pins the event loop's thread and the SQLite store's thread to one CPU once the
    app has started (:mod:`tether.affinity`); None where nothing is to be pinned."""
    if not settings.pin_cpu:
        return None

    async def pin() -> Pinned | None:
        cpu = affinity.choose(settings.worker)
        if cpu is None or runtime.store_thread() is None:
            return None  # one CPU, or a store with no thread of its own (PostgreSQL)
        # Native thread pools started from the loop's thread would be pinned with it: the
        # embedder's tokenizer starts its own as it warms up, in a thread; uvloop starts its
        # resolver's on the first lookup, made here. (What else does is swept.)
        await runtime.warmed()
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().getaddrinfo("localhost", None)
        thread = runtime.store_thread()
        if thread is None:
            return None  # closed meanwhile
        pinned = affinity.pin([thread], cpu)
        if pinned is not None:
            log.info("the event loop and the store's thread run on CPU %d", cpu)
        return pinned

    return pin


@contextlib.contextmanager
def _sigterm_exits_cleanly() -> Iterator[None]:
    """uvicorn re-raises the signal it shut down for; after a drain, SIGTERM is a clean exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_cleanly(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, exit_cleanly)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_bind(settings: Settings) -> None:
    """Refuse a non-loopback bind with no API keys (nor JWT keys) unless ``insecure`` says
    so."""
    if settings.loopback or settings.insecure or settings.jwt is not None:
        return

    async def count() -> int:
        store = open_store_url(settings.store_url)
        await store.open()
        try:
            return await ApiKeys(store).count_active()
        finally:
            await store.close()

    if asyncio.run(count()) == 0:
        raise ConfigError(
            f"refusing to listen on {settings.host}: no API keys exist, so anyone who can reach "
            "this address would have full access. Create one with `tether keys create --user "
            "NAME`, bind to 127.0.0.1, or pass --insecure if that is really what you want."
        )


def model_problems(agents: Iterable[Agent], default_model: str | None) -> list[str]:
    """Why an agent's model cannot run, said when a server starts (a missing API key, an
    unknown provider): its turns would all fail with that reason. The embedded models are
    checked when first used (their weights load then)."""
    from tether.models import default_model_spec, resolve_model

    problems = []
    for agent in agents:
        spec = agent.model if agent.model is not None else default_model or default_model_spec()
        if not isinstance(spec, str) or spec.startswith("local"):
            continue
        try:
            resolve_model(spec)
        except ConfigError as exc:
            problems.append(f"agent {agent.name}: {exc}; its turns will fail until that is fixed")
    return problems


def _module_from_file(path: Path) -> Any:
    """The module of a script given by its path (``../myapp.py:app``), with its directory on
    ``sys.path``, as running it from there would."""
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(f"{str(path)!r}: no such Python file (or use 'module:attribute')")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    # This very file, under a name of its own: named after it ("json.py", "secrets.py"), it
    # would stand in for that module wherever the process imports it next.
    name = f"tether_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # what its classes name as their module must be found
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]  # half made: never found as if it had loaded
        if isinstance(exc, ImportError):
            raise ConfigError(f"cannot import {str(path)!r}: {exc}") from exc
        raise
    return module


def load_agents(spec: str) -> list[Agent]:
    """Agents from ``module:attr`` or ``path/to/script.py:attr`` (an App, an Agent or a list of
    them) or a YAML file."""
    if spec.endswith((".yaml", ".yml")):
        from tether.agents_yaml import load_yaml_agents

        # Through App: the agents they hand off to are checked to be among them.
        return App(agents=load_yaml_agents(Path(spec))).agents
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(f"{spec!r}: expected 'module:attribute' or a .yaml file")
    if module_name.endswith(".py") or "/" in module_name:
        module = _module_from_file(Path(module_name))
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except (ImportError, TypeError) as exc:  # TypeError: a relative name ("..app")
            raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    target: Any = getattr(module, attr, None)
    if target is None:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
    if isinstance(target, App):
        return target.agents
    if isinstance(target, Agent):
        return App(agents=[target]).agents
    if isinstance(target, list | tuple) and all(isinstance(a, Agent) for a in target):
        return App(agents=target).agents
    raise ConfigError(f"{spec} is a {type(target).__name__}, not an App, Agent or list of agents")
