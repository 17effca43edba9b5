"""HTTP load on ``tether serve`` in front of a fake OpenAI model: throughput, latency, CPU, RSS.

Reproduce (from the repository root)::

    .venv/bin/python bench/http_load.py                # full run, < 3 min on 2 cores
    .venv/bin/python bench/http_load.py --quick        # smoke test, ~1 min
    .venv/bin/python bench/http_load.py --profile      # then py-spy the server (0 ms, 64 sessions)
    .venv/bin/python bench/http_load.py --only-profile --profile-seconds 20 --profile-path chat

Three processes, all on 127.0.0.1: the fake OpenAI model (0 ms and then 50 ms latency, a fixed
40-word answer streamed a word at a time), ``tether serve`` (a free port, a temporary data dir
with SQLite, ``--log-level warning``, ``TETHER_MODEL=openai:fake-model``,
``OPENAI_BASE_URL=<fake>``, ``OPENAI_API_KEY=x``) and this one, the load generator: 1, 16 or 64
concurrent sessions, each doing its turns one after the other with its own aiohttp client.

The fake model is ``bench/fake_model.py`` (asyncio protocols, httptools, answers built from
bytes made once: ~0.3 ms of CPU an answer). ``TETHER_BENCH_FAKE=test`` runs the test suite's
fake instead, as figures before 2026-12-06 were measured (``bench/http_load.py --serve-fake
MS``: ``python -m tether.testing.fake_openai`` with ``TCP_NODELAY`` on, see
:class:`NoDelayFakeServer`; ~1.3 ms an answer), ``--stock-fake`` the test fake as it ships
(Nagle left on: ~40 ms added to every model call). All three send the same events.

Paths, at each latency and concurrency:

* ``direct``: the same client calls the fake server's ``/v1/chat/completions`` itself, streaming
  (like tether does) and keeping each conversation's history client-side, so it sends what
  tether would send. The upper limit for tether's numbers.
* ``/v1 turns``: ``POST /v1/sessions/{sid}/turns {"input": ...}`` (waits for the ended turn).
* ``/api/chat``: ``POST /api/chat {"message", "session_id"}``.

Every session does at most ``--turns`` turns (default 10), so prompts stay small (<= 22
messages); a worker that needs more turns for a row's minimum (160) rotates over several
sessions. Sessions are created and get one warm-up turn each before the measured window. CPU
times come from ``/proc/<pid>/stat`` (utime + stime, all threads) before and after the window,
divided by the turns; the client's is its own ``time.process_time()``. RSS per idle session:
``VmRSS`` of the server before and after ``POST /v1/sessions`` x 1,000, divided by 1,000 (and,
in the full run, the same for 1,000 sessions with one turn each).

Targets (2 cores shared by all three processes): at 50 ms and 64 sessions, throughput >= 0.85 x
direct and p99 <= 100 ms; server CPU <= 2 ms per turn at 0 ms; <= 2 KB RSS per idle session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import aiohttp
import httpx
import orjson
from rich.console import Console
from rich.table import Table
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from _serve import cpu_seconds, tree_cpu
from tether.testing.fake_openai import FakeOpenAIServer

LoadPath = Literal["direct", "turns", "chat", "reference"]
PATHS: tuple[LoadPath, ...] = ("direct", "turns", "chat")
TETHER_PATHS: tuple[LoadPath, ...] = ("turns", "chat")
PATH_LABELS: dict[LoadPath, str] = {
    "direct": "direct",
    "turns": "/v1 turns",
    "chat": "/api/chat",
    "reference": "reference",  # bench/reference_server.py (hot_path.py)
}
LATENCIES_MS: tuple[int, ...] = (0, 50)
CONCURRENCY: tuple[int, ...] = (1, 16, 64)

RATIO_TARGET = 0.85
P99_TARGET_MS = 100.0
CPU_TARGET_MS = 2.0
RSS_TARGET_KB = 2.0
IDLE_SESSIONS = 1000

MODEL = "fake-model"
# What `tether serve` runs with no app (tether.server.app.default_agent); the direct path sends
# the same system message.
INSTRUCTIONS = "You are a helpful assistant. Answer briefly and accurately."
QUESTION = "Question {n}: how does the scheduler keep exactly one running turn per session?"
ANSWER = (
    "Each session has one lease, a fencing token incremented on every acquisition; the worker "
    "holding it runs queued turns in order, and every write checks the token in the same "
    "transaction, so a stale worker cannot write anything at all."
)

console = Console(highlight=False, width=max(150, Console().width))


# -- processes -----------------------------------------------------------------------------------
def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Servers:
    fake: subprocess.Popen[str]
    fake_url: str
    """``http://127.0.0.1:PORT/v1``"""
    tether: subprocess.Popen[bytes]
    """The server under load: ``tether serve`` (or, in hot_path.py, the reference server)."""
    tether_url: str
    data_dir: Path

    def db_kb(self) -> int:
        """Size of the SQLite database with its WAL."""
        return sum(f.stat().st_size for f in self.data_dir.glob("tether.db*")) // 1024

    def server_cpu(self) -> float:
        """CPU seconds of the server and of any worker processes it started."""
        return sum(tree_cpu(self.tether.pid).values())


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fail(what: str, log: IO[bytes]) -> RuntimeError:
    return RuntimeError(f"{what}\n{log_tail(log)}")


def log_tail(log: IO[bytes], size: int = 2000) -> str:
    """The end of a server's log file. ``pread``, because the server shares the file's offset
    (its stderr is this very open file) and may still be writing."""
    end = os.fstat(log.fileno()).st_size
    return os.pread(log.fileno(), size, max(0, end - size)).decode(errors="replace")


class NoDelayFakeServer(FakeOpenAIServer):
    """The fake OpenAI server with ``TCP_NODELAY`` on its connections.

    ``FakeOpenAIServer._bind`` makes its socket with ``socket.socket(AF_INET, SOCK_STREAM)``,
    whose ``proto`` is 0, so asyncio (which only sets ``TCP_NODELAY`` when ``proto`` is
    ``IPPROTO_TCP``) leaves Nagle on: the first body chunk then waits for the ACK of the
    response headers, which the client delays by ~40 ms. Every model call would pay that, and
    it would swamp what this benchmark measures (``--stock-fake`` shows it). Linux copies the
    option from the listening socket to the accepted ones.
    """

    def _bind(self) -> socket.socket:
        sock = super()._bind()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    # Two bench-only endpoints. ``/bench/inflight``: how many chat requests are in flight,
    # from their arrival to the last byte of their answer, and the most there were since the
    # last ``POST`` to it (which tells whether a server sends its sessions' model calls at
    # once or serializes them). ``POST /bench/latency {"ms"}``: the latency of the next
    # answers, so that one model process serves a whole run. Handlers all run on the server's
    # one event loop, so the counters need no lock.
    def __init__(self, latency_ms: float, reply: str) -> None:
        super().__init__(latency_ms, reply)
        self.in_flight = self.peak = self.served = 0
        self.app.router.routes += [
            Route("/bench/inflight", self._inflight, methods=["GET", "POST"]),
            Route("/bench/latency", self._latency, methods=["POST"]),
        ]

    async def _chat(self, request: Request) -> Response:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.served += 1
        try:
            response = await super()._chat(request)
        except BaseException:
            self.in_flight -= 1
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._counted(response.body_iterator)
        else:
            self.in_flight -= 1
        return response

    async def _counted(self, body: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for chunk in body:
                yield chunk
        finally:  # also when the client goes away mid-answer (the stream is cancelled)
            self.in_flight -= 1

    async def _inflight(self, request: Request) -> Response:
        if request.method == "POST":
            self.peak = self.in_flight
        return JSONResponse({"now": self.in_flight, "peak": self.peak, "served": self.served})

    async def _latency(self, request: Request) -> Response:
        self.latency_ms = float((await request.json())["ms"])
        return JSONResponse({"latency_ms": self.latency_ms})

    def _record(self, body: dict[str, Any]) -> None:
        # The test fake keeps every request body for tests to read back; a bench run sends it
        # thousands, some with 600-message histories, and a growing heap made each answer
        # cost more of its CPU (and spread its chunks out) the longer the run went on.
        del body


async def model_in_flight(fake_url: str, *, reset: bool = False) -> int | None:
    """The peak of chat requests in flight at the bench's fake model (see
    :class:`NoDelayFakeServer`) since the last reset; ``reset`` starts a new count. None for
    the stock fake, which does not count."""
    url = fake_url.removesuffix("/v1") + "/bench/inflight"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        r = await (client.post(url) if reset else client.get(url))
    return int(r.json()["peak"]) if r.status_code == 200 else None


def set_model_latency(fake_url: str, latency_ms: float) -> None:
    """Set the bench fake model's latency for the answers that follow."""
    url = fake_url.removesuffix("/v1") + "/bench/latency"
    httpx.post(url, json={"ms": latency_ms}, trust_env=False, timeout=10).raise_for_status()


def serve_fake(latency_ms: float) -> None:
    """``--serve-fake``: what ``python -m tether.testing.fake_openai`` does, without Nagle."""
    NoDelayFakeServer(latency_ms, ANSWER).serve_forever()


@contextlib.contextmanager
def servers(latency_ms: float, *, stock_fake: bool = False) -> Iterator[Servers]:
    """The fake model server and ``tether serve`` in front of it, stopped on exit."""
    with (
        tempfile.TemporaryDirectory(prefix="tether-http-load-") as tmp,
        fake_model(latency_ms, stock_fake=stock_fake) as (fake, fake_url),
        tether_serve(fake_url, Path(tmp) / "data") as (tether, url, _),
    ):
        yield Servers(fake, fake_url, tether, url, Path(tmp) / "data")


@contextlib.contextmanager
def fake_model(
    latency_ms: float, *, stock_fake: bool = False
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The fake OpenAI server as a process, and its ``/v1`` URL; stopped on exit."""
    with tempfile.TemporaryFile() as fake_log:
        kind = "stock" if stock_fake else fake_kind()
        if kind == "stock":
            fake_cmd = [sys.executable, "-m", "tether.testing.fake_openai", "--port", "0"]
            fake_cmd += ["--latency-ms", str(latency_ms), "--reply", ANSWER]
        elif kind == "test":
            fake_cmd = [sys.executable, __file__, "--serve-fake", str(latency_ms)]
        else:
            fake_cmd = [sys.executable, str(Path(__file__).with_name("fake_model.py"))]
            fake_cmd += ["--latency-ms", str(latency_ms), "--reply", ANSWER]
        fake = subprocess.Popen(fake_cmd, stdout=subprocess.PIPE, stderr=fake_log, text=True)
        try:
            assert fake.stdout is not None
            ready, _, _ = select.select([fake.stdout], [], [], 30)
            line = fake.stdout.readline() if ready else ""
            if not line.startswith("listening on "):
                raise _fail("the fake OpenAI server did not start", fake_log)
            yield fake, line.removeprefix("listening on ").strip()
        finally:
            _stop(fake)


FAKE_ENV = "TETHER_BENCH_FAKE"
FAKE_KINDS = ("lean", "test", "stock")


def fake_kind() -> str:
    """Which fake model the benchmarks run (``TETHER_BENCH_FAKE``): ``lean`` (the default,
    ``bench/fake_model.py``), ``test`` (the test suite's fake with ``TCP_NODELAY``, as the
    figures before 2026-12-06 were measured) or ``stock`` (the test fake as it ships)."""
    kind = os.environ.get(FAKE_ENV, "lean") or "lean"
    if kind not in FAKE_KINDS:
        raise SystemExit(f"{FAKE_ENV} must be one of {', '.join(FAKE_KINDS)}, not {kind!r}")
    return kind


def model_env(fake_url: str) -> dict[str, str]:
    """The environment of a server in front of the fake model (no TETHER_* from the caller's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return env | {
        "TETHER_MODEL": f"openai:{MODEL}",
        "OPENAI_BASE_URL": fake_url,
        "OPENAI_API_KEY": "x",
        "NO_PROXY": "127.0.0.1,localhost",
    }


@contextlib.contextmanager
def tether_serve(
    fake_url: str, data_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str, IO[bytes]]]:
    """``tether serve`` (default agent, ``--data-dir data_dir``, ``args``) in front of the fake
    model, its URL once ``/readyz`` answers, and its log (stderr); stopped on exit."""
    with tempfile.TemporaryFile() as tether_log:
        port = free_port()
        cmd = [sys.executable, "-m", "tether", "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--data-dir", str(data_dir), "--log-level", "warning", *args]
        tether = subprocess.Popen(
            cmd,
            env=model_env(fake_url) | (env or {}),
            stdout=subprocess.DEVNULL,
            stderr=tether_log,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(tether, f"{url}/readyz", tether_log)
            yield tether, url, tether_log
        finally:
            _stop(tether)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: IO[bytes]) -> None:
    deadline = time.monotonic() + 60
    with httpx.Client(trust_env=False, timeout=2) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise _fail(f"tether serve exited with {proc.returncode}", log)
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            time.sleep(0.1)
    raise _fail("tether serve did not become ready", log)


# -- load ----------------------------------------------------------------------------------------
@dataclass
class Conversation:
    sid: str
    messages: list[dict[str, str]] = field(default_factory=list)
    """The direct path's history, kept by the client (tether keeps its own)."""


@dataclass
class Run:
    latency_ms: int
    sessions: int
    path: LoadPath
    turns: int
    wall: float
    latencies: list[float]
    errors: int
    server_cpu: float
    fake_cpu: float
    client_cpu: float
    peak_in_flight: int | None = None
    """The most model requests in flight at once during the window (None: not counted)."""

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall if self.wall else math.inf

    def pct_ms(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    @property
    def busy_cores(self) -> float:
        """CPU of all three processes over the wall time."""
        return (self.server_cpu + self.fake_cpu + self.client_cpu) / self.wall

    def per_turn_ms(self, cpu: float) -> float:
        return 1000 * cpu / self.turns if self.turns else math.nan


Client = aiohttp.ClientSession
JSON_HEADERS = {"content-type": "application/json"}


class Load:
    """A turn on any of the three paths, from one worker's own HTTP client.

    Every worker has its own client of one keep-alive connection, as a user's browser or SDK
    has. The load generator shares the cores with the servers it measures, so it is as lean
    as a Python client gets: aiohttp, bodies written and read with orjson (httpx cost it about
    twice the CPU a turn; a shared pool of 64 httpx connections ~7 ms a request).
    """

    def __init__(self, srv: Servers) -> None:
        self.srv = srv
        self.errors: Counter[str] = Counter()

    async def _post(self, client: Client, url: str, body: dict[str, Any]) -> tuple[int, bytes]:
        async with client.post(url, data=orjson.dumps(body), headers=JSON_HEADERS) as r:
            return r.status, await r.read()

    async def create(self, client: Client, path: LoadPath, conv: Conversation) -> None:
        if path == "reference":  # bench/reference_server.py names its sessions itself
            status, raw = await self._post(client, f"{self.srv.tether_url}/sessions", {})
            if status != 201:
                raise RuntimeError(f"POST /sessions: HTTP {status} {raw[:200]!r}")
            conv.sid = orjson.loads(raw)["id"]
        elif path == "turns":
            url = f"{self.srv.tether_url}/v1/sessions"
            status, raw = await self._post(client, url, {"session_id": conv.sid})
            if status != 201:
                raise RuntimeError(f"POST /v1/sessions: HTTP {status} {raw[:200]!r}")
        elif path == "direct":
            conv.messages = [{"role": "system", "content": INSTRUCTIONS}]
        # /api/chat creates the session on its first turn.

    async def turn(self, client: Client, path: LoadPath, conv: Conversation, n: int) -> bool:
        text = QUESTION.format(n=n)
        base = self.srv.tether_url
        try:
            if path == "direct":
                return await self._direct(client, conv, text)
            if path == "turns":
                url = f"{base}/v1/sessions/{conv.sid}/turns"
                status, raw = await self._post(client, url, {"input": text})
                ok = status == 200 and orjson.loads(raw).get("status") == "completed"
            elif path == "reference":
                url = f"{base}/sessions/{conv.sid}/turns"
                status, raw = await self._post(client, url, {"input": text})
                ok = status == 200 and "output" in orjson.loads(raw)
            else:
                body = {"message": text, "session_id": conv.sid}
                status, raw = await self._post(client, f"{base}/api/chat", body)
                ok = status == 200
            if not ok:
                self.errors[f"{path}: HTTP {status} {raw[:200]!r}"] += 1
            return ok
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.errors[f"{path}: {type(exc).__name__}: {exc}"] += 1
            return False

    async def _direct(self, client: Client, conv: Conversation, text: str) -> bool:
        user = {"role": "user", "content": text}
        body = {
            "model": MODEL,
            "messages": [*conv.messages, user],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        parts: list[str] = []
        async with client.post(
            f"{self.srv.fake_url}/chat/completions",
            data=orjson.dumps(body),
            headers={**JSON_HEADERS, "authorization": "Bearer x"},
        ) as r:
            if r.status != 200:
                self.errors[f"direct: HTTP {r.status}"] += 1
                return False
            async for line in r.content:  # read to the end: the connection is reused
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                for choice in orjson.loads(line[6:])["choices"]:
                    if content := choice["delta"].get("content"):
                        parts.append(content)
        conv.messages += [user, {"role": "assistant", "content": "".join(parts)}]
        return True


@contextlib.asynccontextmanager
async def clients(count: int) -> AsyncIterator[list[Client]]:
    """``count`` clients of one keep-alive connection each."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=1),
                    timeout=aiohttp.ClientTimeout(total=120),
                    trust_env=False,
                )
            )
            for _ in range(count)
        ]


async def run_load(
    srv: Servers,
    latency_ms: int,
    path: LoadPath,
    sessions: int,
    *,
    per_session: int,
    min_turns: int,
    tag: str,
    around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Run:
    """``sessions`` workers doing their turns on ``path``; ``around()`` is entered around the
    measured window (for measures of the caller's own)."""
    turns_each = max(per_session, math.ceil(min_turns / sessions))
    convs = [
        [Conversation(f"{tag}-w{w}-s{k}") for k in range(math.ceil(turns_each / per_session))]
        for w in range(sessions)
    ]
    load = Load(srv)
    async with clients(sessions) as pool:

        async def set_up(client: Client, group: list[Conversation]) -> None:
            for n, conv in enumerate(group):
                await load.create(client, path, conv)
                await load.turn(client, path, conv, -1 - n)  # warm-up, not measured

        async def work(client: Client, group: list[Conversation], out: list[float]) -> None:
            for n in range(turns_each):
                start = time.perf_counter()
                if await load.turn(client, path, group[n % len(group)], n):
                    out.append(time.perf_counter() - start)

        await asyncio.gather(*(set_up(c, g) for c, g in zip(pool, convs, strict=True)))
        per_worker: list[list[float]] = [[] for _ in convs]
        await model_in_flight(srv.fake_url, reset=True)
        with around():
            server0, fake0 = srv.server_cpu(), cpu_seconds(srv.fake.pid)
            client0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(
                *(work(c, g, out) for c, g, out in zip(pool, convs, per_worker, strict=True))
            )
            wall = time.perf_counter() - wall0
            client_cpu = time.process_time() - client0
            server_cpu = srv.server_cpu() - server0
            fake_cpu = cpu_seconds(srv.fake.pid) - fake0
        peak = await model_in_flight(srv.fake_url)
    for error, count in load.errors.most_common(3):
        console.print(f"[red]  {count} x {error}[/]")
    latencies = [x for out in per_worker for x in out]
    return Run(
        latency_ms=latency_ms,
        sessions=sessions,
        path=path,
        turns=turns_each * sessions,
        wall=wall,
        latencies=latencies,
        errors=turns_each * sessions - len(latencies),
        server_cpu=server_cpu,
        fake_cpu=fake_cpu,
        client_cpu=client_cpu,
        peak_in_flight=peak,
    )


@dataclass
class Memory:
    label: str
    before_kb: int
    after_kb: int
    count: int
    db_growth_kb: int

    @property
    def per_session_kb(self) -> float:
        return (self.after_kb - self.before_kb) / self.count


async def idle_memory(srv: Servers, *, count: int, with_turn: bool, tag: str) -> Memory:
    """Server RSS before and after ``count`` new sessions (each with one turn if ``with_turn``)."""
    pid = srv.tether.pid
    load = Load(srv)
    workers = 16
    async with clients(workers) as pool:

        async def make(client: Client, ids: Sequence[int], turn: bool) -> None:
            for i in ids:
                conv = Conversation(f"{tag}-{i}")
                await load.create(client, "turns", conv)
                if turn:
                    await load.turn(client, "turns", conv, i)

        # Warm-up: 64 sessions with a turn each fill the server's caches and pools first.
        await asyncio.gather(
            *(make(c, range(-1 - w, -65, -workers), True) for w, c in enumerate(pool))
        )
        await asyncio.sleep(1.0)  # lingering session workers give their leases up (0.25 s)
        before, db_before = rss_kb(pid), srv.db_kb()
        await asyncio.gather(
            *(make(c, range(w, count, workers), with_turn) for w, c in enumerate(pool))
        )
        await asyncio.sleep(1.0)
        after, db_after = rss_kb(pid), srv.db_kb()
    if load.errors:
        console.print(f"[red]  errors: {dict(load.errors)}[/]")
    label = "sessions with one turn each" if with_turn else "POST /v1/sessions"
    return Memory(label, before, after, count, db_after - db_before)


# -- profiling -----------------------------------------------------------------------------------
def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


async def profile(
    path: LoadPath,
    sessions: int,
    seconds: float,
    out: Path,
    *,
    stock_fake: bool,
    latency_ms: float = 0.0,
) -> bool:
    """py-spy the server (model latency ``latency_ms``) while ``sessions`` sessions drive
    ``path``; True if the raw stacks were written to ``out``."""
    exe = py_spy()
    if exe is None:
        console.print("[red]py-spy not found: .venv/bin/pip install py-spy[/]")
        return False
    console.print(
        f"\n[bold]Profile: tether serve under {sessions} sessions on {PATH_LABELS[path]}, "
        f"{latency_ms:g} ms model, py-spy for {seconds:g} s (--nonblocking, idle threads left"
        " out)[/]"
    )
    with servers(latency_ms, stock_fake=stock_fake) as srv:
        async with clients(sessions) as pool:
            load = Load(srv)
            stop = asyncio.Event()
            done = [0]

            async def work(w: int, client: Client) -> None:
                n = 0
                while not stop.is_set():
                    # A fresh session every 10 turns keeps the prompt small, as in the tables.
                    conv = Conversation(f"prof-w{w}-s{n // 10}")
                    if n % 10 == 0:
                        await load.create(client, path, conv)
                    await load.turn(client, path, conv, n)
                    n += 1
                    done[0] += 1

            tasks = [asyncio.create_task(work(w, c)) for w, c in enumerate(pool)]
            await asyncio.sleep(2.0)  # warm-up
            start, turns0 = time.perf_counter(), done[0]
            cpu0 = cpu_seconds(srv.tether.pid)
            spy = await asyncio.create_subprocess_exec(
                exe,
                "record",
                "--pid",
                str(srv.tether.pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "200",
                "--nonblocking",
                "--format",
                "raw",
                "--full-filenames",
                "--threads",
                "--output",
                str(out),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await spy.communicate()
            turns, wall = done[0] - turns0, time.perf_counter() - start
            cpu = cpu_seconds(srv.tether.pid) - cpu0
            stop.set()
            await asyncio.gather(*tasks)
    if spy.returncode != 0:
        console.print(f"[red]py-spy failed: {err.decode(errors='replace')[-500:]}[/]")
        return False
    console.print(
        f"{turns} turns in {wall:.1f} s ({turns / wall:.0f}/s) while sampled; server CPU "
        f"{1000 * cpu / max(1, turns):.2f} ms/turn (sampling inflates it). Raw stacks: {out} "
        "(flamegraph.pl or speedscope.app read them)"
    )
    return True


def _frame(frame: str) -> tuple[str, str]:
    """``"fn (path/to/file.py:12)"`` -> (``"fn"``, ``"path/to/file.py"``)."""
    name, _, where = frame.partition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def _package(file: str) -> str:
    """``tether.<module>``, a site-packages distribution, or ``stdlib:<module>``."""
    if "/site-packages/" in file:
        return file.split("/site-packages/", 1)[1].split("/")[0].removesuffix(".py")
    if "/tether/" in file:
        return "tether." + file.split("/tether/", 1)[1].split("/")[0].removesuffix(".py")
    parts = Path(file).parts
    inner = parts[-2] if len(parts) > 1 and not parts[-2].startswith("python3") else ""
    return "stdlib:" + (inner or Path(file).stem)


def _short(file: str) -> str:
    for marker in ("/site-packages/", "/src/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return "/".join(Path(file).parts[-2:])


# Frames every sample of the server's main thread passes through: not worth a row.
_ENTRY = (
    "tether/__main__.py",
    "tether/cli/__init__.py",
    "tether/cli/serve.py",
    "tether/app.py",
    "uvicorn/server.py",
    "uvicorn/_compat.py",
    "uvicorn/main.py",
)


def _bucket(thread: str, files: list[str], names: list[str]) -> str:
    """Which part of the server a sample belongs to (first match, most specific first)."""
    if thread.startswith("tether-sqlite"):
        return "SQLite thread: queries and commits"
    if thread.startswith("AnyIO worker"):
        return "AnyIO worker threads (FastAPI runs sync dependencies there)"
    if not thread.startswith("MainThread"):
        return f"thread {thread}"
    files = [f for f in files if not f.endswith(_ENTRY)]

    def has(part: str) -> bool:
        return any(part in f for f in files)

    if has("tether/models/openai.py") or has("/openai/") or has("/httpx2/") or has("/httpcore2/"):
        if has("openai/_utils/_transform.py"):
            return "openai SDK: request params transform (maybe_transform)"
        if "BaseClient._process_response_data" in names:
            return "openai SDK: chunk JSON -> ChatCompletionChunk objects"
        if has("/httpx2/") or has("/httpcore2/") or has("/anyio/"):
            return "openai SDK: httpx2/httpcore2/anyio I/O"
        return "openai SDK: the rest (SSE decoding, build_request, ...)"
    if has("tether/loop/"):
        return "turn loop: prepare, window, emit (besides the model call)"
    if has("tether/store/"):
        return "store calls, event-loop side (executor hand-off)"
    if has("tether/scheduler/"):
        return "scheduler / runner"
    if has("/uvicorn/") or has("/h11/") or has("/starlette/") or has("/fastapi/"):
        return "HTTP in: uvicorn + h11 + Starlette/FastAPI + routes"
    if has("asyncio/") or has("selectors.py"):
        return "asyncio event loop itself (select, callbacks, thread wake-ups)"
    return "other (mostly stacks cut short by --nonblocking sampling)"


def report_profile(raw: Path) -> None:
    """py-spy's raw (collapsed) stacks: by part of the server, by package, top leaves, tether
    functions inclusive."""
    buckets: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread ") else "?"
        frames = [f for f in frames if f.endswith(")") and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        parsed = [_frame(f) for f in frames]
        buckets[_bucket(thread, [file for _, file in parsed], [name for name, _ in parsed])] += (
            count
        )
        name, file = parsed[-1]
        leaves[f"{name}  {_short(file)}"] += count
        seen: set[str] = set()
        for name, file in parsed:
            package = _package(file)
            if file.endswith(_ENTRY) or package in ("typer", "stdlib:<frozen runpy>"):
                continue
            if not package.startswith("stdlib:"):
                seen.add(package)
            if package.startswith("tether."):
                seen.add(f"{_short(file)}:{name}")
        for key in seen:
            (inclusive if ":" in key else packages)[key] += count
    if not total:
        console.print("[red]no samples[/]")
        return

    def table(title: str, counts: Counter[str], n: int, what: str) -> Table:
        t = Table(title=title)
        t.add_column(what)
        t.add_column("% of samples", justify="right")
        for key, c in counts.most_common(n):
            t.add_row(key, f"{100 * c / total:.1f}")
        return t

    console.print(f"{total} samples of threads that were not idle")
    console.print(table("Where the server's CPU goes", buckets, 20, "part"))
    console.print(table("By package, anywhere on the stack (inclusive)", packages, 12, "package"))
    console.print(table("Top self time (innermost frame)", leaves, 15, "function  file"))
    console.print(table("tether functions, inclusive", inclusive, 20, "file:function"))


# -- report --------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def load_table(runs: list[Run]) -> Table:
    table = Table(title="tether serve under HTTP load (fake OpenAI model, SQLite)")
    cols = (
        "model",
        "sessions",
        "path",
        "turns",
        "turns/s",
        "x direct",
        "p50 ms",
        "p99 ms",
        "tether CPU ms/turn",
        "model CPU ms/turn",
        "client CPU ms/turn",
        "client % core",
        "busy cores",
        "errors",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=col == "path")
    direct: dict[tuple[int, int], Run] = {}
    for r in runs:
        if r.path == "direct":
            direct[(r.latency_ms, r.sessions)] = r
        base = direct.get((r.latency_ms, r.sessions))
        ratio = (
            "" if r.path == "direct" or base is None else f"{r.turns_per_s / base.turns_per_s:.2f}"
        )
        table.add_row(
            f"{r.latency_ms} ms",
            str(r.sessions),
            PATH_LABELS[r.path],
            str(r.turns),
            f"{r.turns_per_s:,.0f}",
            ratio,
            f"{r.pct_ms(0.50):.1f}",
            f"{r.pct_ms(0.99):.1f}",
            "-" if r.path == "direct" else f"{r.per_turn_ms(r.server_cpu):.2f}",
            f"{r.per_turn_ms(r.fake_cpu):.2f}",
            f"{r.per_turn_ms(r.client_cpu):.2f}",
            f"{100 * r.client_cpu / r.wall:.0f}",
            f"{r.busy_cores:.2f}",
            str(r.errors) if r.errors else "",
            end_section=r.path == "chat" and r.sessions == CONCURRENCY[-1],
        )
    return table


def memory_table(rows: list[Memory]) -> Table:
    table = Table(title="Server RSS per idle session")
    for col in ("sessions", "count", "RSS before", "RSS after", "per session", "DB+WAL growth"):
        table.add_column(col, justify="left" if col == "sessions" else "right")
    for m in rows:
        table.add_row(
            m.label,
            f"{m.count:,}",
            f"{m.before_kb / 1024:.1f} MB",
            f"{m.after_kb / 1024:.1f} MB",
            f"{m.per_session_kb:.2f} KB",
            f"{m.db_growth_kb / 1024:.1f} MB",
        )
    return table


def targets(runs: list[Run], memory: list[Memory]) -> None:
    def find(latency: int, sessions: int, path: LoadPath) -> Run:
        return next(
            r for r in runs if r.latency_ms == latency and r.sessions == sessions and r.path == path
        )

    top = CONCURRENCY[-1]
    console.print("\n[bold]Targets[/]")
    for path in TETHER_PATHS:
        label = PATH_LABELS[path]
        r, d = find(50, top, path), find(50, top, "direct")
        ratio = r.turns_per_s / d.turns_per_s
        console.print(
            f"  {label}, 50 ms, {top} sessions: {r.turns_per_s:,.0f} turns/s = {ratio:.2f} x "
            f"direct ({d.turns_per_s:,.0f}) (target >= {RATIO_TARGET}) "
            f"{verdict(ratio >= RATIO_TARGET)}; p99 {r.pct_ms(0.99):.0f} ms "
            f"(target <= {P99_TARGET_MS:.0f}) {verdict(r.pct_ms(0.99) <= P99_TARGET_MS)}"
        )
    for path in TETHER_PATHS:
        zero = [r for r in runs if r.latency_ms == 0 and r.path == path]
        worst = max(zero, key=lambda r: r.per_turn_ms(r.server_cpu))
        at_top = find(0, top, path)
        console.print(
            f"  {PATH_LABELS[path]}, 0 ms: server CPU {at_top.per_turn_ms(at_top.server_cpu):.2f}"
            f" ms/turn at {top} sessions, worst {worst.per_turn_ms(worst.server_cpu):.2f} at "
            f"{worst.sessions} (target <= {CPU_TARGET_MS:.0f}) "
            f"{verdict(worst.per_turn_ms(worst.server_cpu) <= CPU_TARGET_MS)}"
        )
    for m in memory:
        console.print(
            f"  RSS per idle session ({m.label}): {m.per_session_kb:.2f} KB "
            f"(target <= {RSS_TARGET_KB:.0f} KB) {verdict(m.per_session_kb <= RSS_TARGET_KB)}"
        )
    busiest = max(runs, key=lambda r: r.client_cpu / r.wall)
    console.print(
        f"  Load generator (one process): busiest at {busiest.latency_ms} ms, "
        f"{busiest.sessions} sessions, {PATH_LABELS[busiest.path]}: "
        f"{100 * busiest.client_cpu / busiest.wall:.0f} % of a core. All three processes share "
        f"{_cpus()} cores; 'busy cores' per run = (tether + model + client CPU) / wall."
    )


async def main_async(args: argparse.Namespace) -> None:
    per_session: int = args.turns or (4 if args.quick else 10)
    min_turns: int = 24 if args.quick else 160
    started = time.perf_counter()
    runs: list[Run] = []
    memory: list[Memory] = []
    if not args.only_profile:
        for latency in LATENCIES_MS:
            with servers(latency, stock_fake=args.stock_fake) as srv:
                if latency == 0:
                    memory.append(
                        await idle_memory(srv, count=IDLE_SESSIONS, with_turn=False, tag="idle")
                    )
                    if not args.quick:
                        memory.append(
                            await idle_memory(
                                srv, count=IDLE_SESSIONS, with_turn=True, tag="idle-turn"
                            )
                        )
                for sessions in CONCURRENCY:
                    for path in PATHS:
                        run = await run_load(
                            srv,
                            latency,
                            path,
                            sessions,
                            per_session=per_session,
                            min_turns=min_turns,
                            tag=f"L{latency}-c{sessions}-{path}",
                        )
                        runs.append(run)
                        console.print(
                            f"  {latency:>2} ms {sessions:>2} sessions {PATH_LABELS[path]:<9}: "
                            f"{run.turns_per_s:7,.0f} turns/s, p99 {run.pct_ms(0.99):6.1f} ms, "
                            f"busy cores {run.busy_cores:.2f}",
                            style="dim",
                        )
        console.print(load_table(runs))
        console.print(
            f"Each session: <= {per_session} turns (prompt <= {2 * per_session + 2} messages), "
            f"1 warm-up turn; >= {min_turns} measured turns per row. The model answers "
            f"{len(ANSWER.split())} words, streamed a word at a time. 'x direct' = turns/s over "
            "the direct row's. CPU columns: CPU seconds of that process over the measured window"
            " / turns ('client' = this load generator)."
        )
        console.print(memory_table(memory))
        console.print(
            "RSS: VmRSS of the server after 64 warm-up sessions, then after the new ones (and "
            "1 s for lingering workers to let go). It includes SQLite's page cache (up to 32 MB, "
            "PRAGMA cache_size=-32000), which keeps the pages the new rows were written to."
        )
        targets(runs, memory)
        console.print(f"\nTotal {time.perf_counter() - started:.0f} s; load average {_load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~30 s)")
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default 10)")
    parser.add_argument(
        "--profile", action="store_true", help="after the tables, py-spy the server under load"
    )
    parser.add_argument("--only-profile", action="store_true", help="skip the tables")
    parser.add_argument("--profile-seconds", type=float, default=15.0)
    parser.add_argument("--profile-sessions", type=int, default=64)
    parser.add_argument("--profile-latency", type=float, default=0.0, help="model latency, ms")
    parser.add_argument("--profile-path", choices=("turns", "chat"), default="turns")
    parser.add_argument("--profile-out", default="/tmp/tether-http-load.pyspy.txt")
    parser.add_argument(
        "--stock-fake",
        action="store_true",
        help="run the model server as `python -m tether.testing.fake_openai` (Nagle left on)",
    )
    parser.add_argument("--serve-fake", type=float, metavar="LATENCY_MS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake is not None:
        serve_fake(args.serve_fake)
        return

    command = " ".join([".venv/bin/python", "bench/http_load.py", *sys.argv[1:]])
    console.print(f"[bold]Command:[/] {command}")
    console.print(
        f"Python {platform.python_version()}, {platform.machine()}, {_cpus()} CPUs, "
        f"aiohttp {aiohttp.__version__}; load average {_load()} before the run "
        "(other processes on these cores inflate CPU times and latencies)"
    )
    asyncio.run(main_async(args))
    if args.profile or args.only_profile:
        out = Path(args.profile_out)
        sampled = asyncio.run(
            profile(
                args.profile_path,
                args.profile_sessions,
                args.profile_seconds,
                out,
                stock_fake=args.stock_fake,
                latency_ms=args.profile_latency,
            )
        )
        if sampled and out.exists():
            report_profile(out)


def _cpus() -> int:
    return os.cpu_count() or 1


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
