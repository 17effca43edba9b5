"""The chat's terminal: lines read off the event loop, so leaving never waits for a read."""

from __future__ import annotations

import asyncio
import signal
import threading

from rich.console import Console


class Terminal:
    """Reads lines on a daemon thread, so leaving the chat never waits for a blocked read.

    There is only ever one read in flight. A caller that stops waiting (Ctrl-C cancels a
    turn while its approval question is open) leaves that read to the next caller, whose
    prompt is printed instead: the line typed next is never swallowed by an abandoned read.
    """

    def __init__(self, out: Console) -> None:
        self._out = out
        self._reading: asyncio.Future[str] | None = None

    async def read(self, prompt: str) -> str:
        reading = self._reading
        if reading is None:
            reading = self._reading = self._start(prompt)
        elif not reading.done():
            self._out.print(prompt, end="", markup=False, highlight=False)
        try:
            # Shielded: cancelling this caller must not cancel the read (see the class doc).
            line = await asyncio.shield(reading)
        except asyncio.CancelledError:
            raise  # the read stays in flight for the next caller
        except BaseException:
            self._reading = None
            raise
        self._reading = None
        return line

    def _start(self, prompt: str) -> asyncio.Future[str]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()

        def deliver(line: str | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(line or "")

        def read() -> None:
            try:
                line = input(prompt)
            except BaseException as exc:  # EOFError, KeyboardInterrupt: hand them to the loop
                loop.call_soon_threadsafe(deliver, None, exc)
                return
            loop.call_soon_threadsafe(deliver, line, None)

        threading.Thread(target=read, daemon=True).start()
        return fut


class Interrupted(Exception):
    """Ctrl-C at the prompt: the user is leaving."""


async def read_prompt(terminal: Terminal, prompt: str) -> str:
    """The next line typed at the prompt; ``EOFError`` on Ctrl-D, :class:`Interrupted` on Ctrl-C.

    Ctrl-C means "cancel the reply" while one streams (the chat installs its own handler then)
    and "leave" at the prompt; here it is caught as that, not as a KeyboardInterrupt that would
    tear through the event loop and end the chat without a word.
    """
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(terminal.read(prompt))
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        waiting.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await waiting
    except asyncio.CancelledError:
        if interrupted:
            raise Interrupted from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
