"""``tether serve``: the HTTP server."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from tether.cli._options import DataDirOpt, HostOpt, ModelOpt, PortOpt, StoreOpt, settings
from tether.cli._output import err, errors

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


def serve(
    target: Annotated[
        str | None,
        typer.Argument(
            help="module:app or path/to/app.py:app (an App, Agent or list of agents) or "
            "agents.yaml; "
            "default: one 'assistant' agent on the default model."
        ),
    ] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    store: StoreOpt = None,
    model: ModelOpt = None,
    data_dir: DataDirOpt = None,
    insecure: Annotated[
        bool,
        typer.Option(
            help="Allow a non-loopback bind with no API keys (everyone gets full access).",
            show_default=False,
        ),
    ] = False,
    node: Annotated[str | None, typer.Option(help="Stable node name (env TETHER_NODE).")] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            min=0,
            envvar="TETHER_DRAIN_TIMEOUT",
            help="Seconds running turns get to finish on SIGTERM/SIGINT before they are "
            "cancelled with reason 'shutdown' (default 10).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Server processes sharing the port and the store, one core each "
            "(env TETHER_WORKERS; default 1: this process alone).",
        ),
    ] = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            case_sensitive=False,
            help="Level of the server's log lines (tether's and uvicorn's; other libraries "
            "log warnings only).",
        ),
    ] = "info",
    access_log: Annotated[
        bool,
        typer.Option(
            "--access-log/--no-access-log",
            help="Log one line per request (default: on).",
            show_default=False,
        ),
    ] = True,
) -> None:
    """Run the HTTP server (SQLite under ./.tether and the embedded model by default)."""
    from tether.app import load_agents, model_problems, ready_line
    from tether.app import serve as run_server
    from tether.server.app import default_agent

    with errors():
        config = settings(
            host=host,
            port=port,
            store=store,
            model=model,
            data_dir=data_dir,
            insecure=insecure or None,
            node=node,
            drain_timeout=drain_timeout,
            workers=workers,
        )
        agents = load_agents(target) if target else [default_agent(config)]
        for problem in model_problems(agents, config.model):
            err.print(f"tether: warning: {problem}", markup=False)

        def announce(url: str) -> None:  # once the socket listens: never before a bind fails
            # With workers, once all of them serve (the parent prints it).
            err.print(ready_line(agents, config, url), markup=False)

        run_server(config, agents, log_level=log_level, access_log=access_log, on_ready=announce)
