"""What one streamed model call costs tether's process in CPU, by the way it is made.

Reproduce (from the repository root)::

    .venv/bin/python bench/model_call.py               # 2,000 calls a row, ~1 min
    .venv/bin/python bench/model_call.py --calls 500

A turn's model call goes through the ``openai`` SDK (DESIGN: real providers through the SDK):
the SDK builds the request (options, headers, URL) and hands it to its HTTP client, aiohttp in
a server (``use_server_transport``), httpx2 elsewhere; tether reads the streamed body itself
(:mod:`tether.models.openai`). The rows, each against ``bench/fake_model.py`` at 0 ms streaming
the benchmarks' 40-word answer, in CPU of this process a call (``getrusage``; the fake model
runs in a process of its own):

* ``OpenAIModel.stream``, aiohttp transport: what ``tether serve`` does;
* ``OpenAIModel.stream``, the SDK's default transport (httpx2): what a script does;
* aiohttp alone: the same body posted with one shared ``ClientSession``, and the answer's
  lines read and their JSON parsed for the text, no SDK: what ``bench/reference_server.py``
  does, the floor of a streamed call in Python here.

Each row runs one call at a time (the process waits for each answer: one session) and 16 at
once (calls overlap, as at 64 sessions). Rows alternate, ``REPEATS`` rounds; the medians are
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import uvloop

from tether.models import openai as openai_model
from tether.models.base import Message, ModelRequest, TextDelta

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from http_load import ANSWER  # noqa: E402  (the benchmarks' answer, from a sibling script)

REPEATS = 5
FLOOR = "aiohttp alone, no SDK (the reference server)"
AT_ONCE = 16
REQUEST = ModelRequest(
    messages=(
        Message(role="system", content="You are a helpful assistant."),
        Message(role="user", content="How does tether keep two turns of one session apart?"),
    )
)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def per_call(calls: int, at_once: int, call: Callable[[], Awaitable[None]]) -> float:
    """CPU microseconds a call: ``calls`` calls, ``at_once`` of them in flight at a time."""
    start = cpu()
    for _ in range(calls // at_once):
        await asyncio.gather(*(call() for _ in range(at_once)))
    return (cpu() - start) / (calls // at_once * at_once) * 1e6


def made(url: str, transport: str) -> openai_model.OpenAIModel:
    """A model whose SDK client has ``transport`` (on the running loop: the client is made on
    first use, with the transport ``TETHER_OPENAI_TRANSPORT`` names then)."""
    model = openai_model.OpenAIModel("fake-model", base_url=url, api_key="x")
    before = os.environ.get(openai_model.TRANSPORT_ENV)
    os.environ[openai_model.TRANSPORT_ENV] = transport
    try:
        model._get_client()
    finally:
        if before is None:
            del os.environ[openai_model.TRANSPORT_ENV]
        else:
            os.environ[openai_model.TRANSPORT_ENV] = before
    return model


class Calls:
    """The three ways of making the call, each checking that it read the whole answer."""

    def __init__(self, url: str) -> None:
        openai_model.use_server_transport()
        self.url = url
        self.served, self.scripted = made(url, "aiohttp"), made(url, "httpx")
        self.body = orjson.dumps(self.served._body(REQUEST))
        self.session = aiohttp.ClientSession()
        self.words = len(ANSWER.split())

    def rows(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "OpenAIModel.stream, aiohttp transport (tether serve)": self.sdk_aiohttp,
            "OpenAIModel.stream, httpx2 transport (a script)": self.sdk_httpx,
            FLOOR: self.aiohttp_alone,
        }

    async def close(self) -> None:
        await self.session.close()
        await self.served.aclose()
        await self.scripted.aclose()

    def check(self, text: list[str], who: str) -> None:
        if len("".join(text).split()) != self.words:
            raise SystemExit(f"{who} read a partial answer: {''.join(text)!r}")

    async def through(self, model: openai_model.OpenAIModel) -> None:
        text = []
        async for event in model.stream(REQUEST):
            if isinstance(event, TextDelta):
                text.append(event.text)
        self.check(text, repr(model))

    async def sdk_aiohttp(self) -> None:
        await self.through(self.served)

    async def sdk_httpx(self) -> None:
        await self.through(self.scripted)

    async def aiohttp_alone(self) -> None:
        text = []
        headers = {"Authorization": "Bearer x", "Content-Type": "application/json"}
        url = f"{self.url}/chat/completions"
        async with self.session.post(url, data=self.body, headers=headers) as r:
            r.raise_for_status()
            async for raw in r.content:  # line by line, as the reference server reads
                line = raw.strip()
                if not line.startswith(b"data:") or line.endswith(b"[DONE]"):
                    continue
                for choice in orjson.loads(line[5:]).get("choices", ()):
                    if content := choice.get("delta", {}).get("content"):
                        text.append(content)
        self.check(text, "aiohttp")


async def measure(url: str, calls: int) -> dict[str, list[float]]:
    ways = Calls(url)
    out: dict[str, list[float]] = {}
    try:
        for call in ways.rows().values():  # warm: connections, caches
            await per_call(200, 1, call)
        for _ in range(REPEATS):
            for name, call in ways.rows().items():
                out.setdefault(f"{name}|1", []).append(await per_call(calls, 1, call))
                out.setdefault(f"{name}|{AT_ONCE}", []).append(await per_call(calls, AT_ONCE, call))
    finally:
        await ways.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="calls a row and round")
    args = parser.parse_args()
    fake = subprocess.Popen(
        [sys.executable, str(HERE / "fake_model.py"), "--reply", ANSWER],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert fake.stdout is not None
        url = fake.stdout.readline().removeprefix("listening on ").strip()
        if not url.startswith("http"):
            raise SystemExit("the fake model did not start")
        figures = uvloop.run(measure(url, args.calls))
    finally:
        fake.kill()
        fake.wait()
    print(f"CPU of this process a streamed call, median of {REPEATS} rounds ({args.calls} calls)")
    print(f"{'call':58s} {'one at a time':>14s} {f'{AT_ONCE} at once':>12s}")
    floor = statistics.median(figures[f"{FLOOR}|{AT_ONCE}"])
    for key in dict.fromkeys(k.split("|")[0] for k in figures):
        one = statistics.median(figures[f"{key}|1"])
        many = statistics.median(figures[f"{key}|{AT_ONCE}"])
        print(f"{key:58s} {one:11.0f} us {many:9.0f} us  ({many / floor:.1f}x floor)")


if __name__ == "__main__":
    main()
