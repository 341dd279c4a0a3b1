"""The thread a client's connection lives on.

pycapnp runs Cap'n Proto on an asyncio event loop with its KJ loop entered
(`capnp.kj_loop()`), and every capability belongs to the thread whose loop
made it. A :class:`Runner` keeps one such loop running on a thread of its
own, so that a blocking :class:`~bitfold_client.Client` keeps its connection
between calls and can be called from any thread, including one that runs
an asyncio loop of its own.
"""

import asyncio
import threading
from typing import Awaitable, Callable, Optional, TypeVar

import capnp

T = TypeVar("T")


class Runner:
    """An asyncio loop with pycapnp's KJ loop, running on a daemon thread
    until :meth:`stop`."""

    def __init__(self, on_stop: Callable[[], Awaitable[None]]):
        self._on_stop = on_stop
        self._ready = threading.Event()
        self._failure: Optional[BaseException] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._main, name="bitfold-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError(f"the bitfold client thread did not start: {self._failure}")

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported to the constructor if it is still waiting
            self._failure = err
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        async with capnp.kj_loop():
            self._ready.set()
            await self._stopping.wait()
            await self._on_stop()

    def run(self, work: Awaitable[T]) -> T:
        """Runs `work` on the loop and waits for its result (or exception)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a bitfold Client was called from its own thread")
        if self.loop is None or not self._thread.is_alive():
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def stop(self) -> None:
        """Closes the connection (`on_stop`), ends the loop and waits for the thread."""
        if self.loop is not None and self._thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
            if threading.current_thread() is not self._thread:
                self._thread.join(10)

    def running(self) -> bool:
        """Whether the loop still runs (the client is not closed)."""
        return self._thread.is_alive() and not (self._stopping and self._stopping.is_set())
