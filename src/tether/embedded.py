"""The embedded Python facade: a process-wide runtime on a background event loop.

``Agent.chat`` and friends may be called from plain scripts, from threads and from any event
loop. All of them submit to one runtime whose loop runs on a daemon thread, so every call on
one session — from any thread or task — goes through the same scheduler and is serialized.
Blocking methods refuse to run inside an event loop rather than deadlock it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from tether.agent import Agent
from tether.errors import SyncInAsyncContext
from tether.records import Event, Policy
from tether.reply import Response
from tether.runtime import OnDecision, Runtime, default_data_dir

T = TypeVar("T")

_lock = threading.Lock()
_runtimes: dict[Path, EmbeddedRuntime] = {}


class EmbeddedRuntime:
    """A :class:`Runtime` driven from any thread through its own loop thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.runtime = Runtime(data_dir=data_dir)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tether-runtime", daemon=True
        )
        self._thread.start()
        self._closed = False

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the runtime loop and block for the result (not from inside an event loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._submit(coro).result()
        coro.close()
        raise SyncInAsyncContext(
            "this blocking method was called inside a running event loop; "
            "use the async twin (achat / astream) instead"
        )

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        # Cancelling the caller cancels the wrapped future, which cancels the task on the
        # runtime loop; Runtime.wait_or_cancel then cancels the turn itself.
        return await asyncio.wrap_future(self._submit(coro))

    def chat_sync(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None,
        policy: Policy,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        return self.call(
            self.runtime.chat(
                agent,
                message,
                session_id=session_id,
                policy=policy,
                on_decision=on_decision,
                idempotency_key=idempotency_key,
            )
        )

    async def chat(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None,
        policy: Policy,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        return await self.acall(
            self.runtime.chat(
                agent,
                message,
                session_id=session_id,
                policy=policy,
                on_decision=on_decision,
                idempotency_key=idempotency_key,
            )
        )

    async def stream(
        self, agent: Agent, message: str, *, session_id: str | None, policy: Policy
    ) -> AsyncIterator[Event]:
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

        def tell(item: Event | BaseException | None) -> None:
            # The caller may have left and its loop closed (a ``break`` out of the loop, then
            # the end of ``asyncio.run``): nobody is listening then.
            with contextlib.suppress(RuntimeError):
                caller.call_soon_threadsafe(queue.put_nowait, item)

        async def pump() -> None:
            try:
                async for event in self.runtime.stream(
                    agent, message, session_id=session_id, policy=policy
                ):
                    tell(event)
            except asyncio.CancelledError:
                raise  # the caller left (below): the turn is cancelled, nobody is told
            except BaseException as exc:
                tell(exc)  # the caller's to raise; raised here too, nobody would retrieve it
                return
            tell(None)

        future = self._submit(pump())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not future.done():
                future.cancel()  # the runtime's stream cancels the turn on the way out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._submit(self.runtime.close()).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def default_runtime() -> EmbeddedRuntime:
    """The embedded runtime for the current data directory (``TETHER_DATA_DIR``)."""
    data_dir = default_data_dir().resolve()
    with _lock:
        rt = _runtimes.get(data_dir)
        if rt is None:
            rt = EmbeddedRuntime(data_dir)
            _runtimes[data_dir] = rt
        return rt


def shutdown() -> None:
    """Finish or cancel running turns and close every embedded runtime (runs at exit)."""
    with _lock:
        runtimes = list(_runtimes.values())
        _runtimes.clear()
    for rt in runtimes:
        rt.close()


atexit.register(shutdown)
