"""A synchronous handle on one stdio MCP server process, and a warm pool of them.

Why a background event loop: the `mcp` SDK is asyncio, while episodes are plain (possibly
concurrent) threads. One loop thread per worker process owns every server connection. Each
connection is one long-lived task that enters the SDK's stdio transport and client session,
reports ready, and holds both until it is closed (anyio wants a context exited by the task that
entered it). Episode threads schedule calls onto that loop and wait with a deadline.

Why a pool: a tool server takes about a second to start (its framework's imports dominate) and
an attempt needs a fresh one (the reference servers keep their state in module globals). The
pool starts `spare` processes ahead, so start-up overlaps the episode before; a server whose
`__reserved__init` resets it completely (`reuse: true`, e.g. `tbhpc mcp-serve`) goes back
into the pool after its attempt instead of being replaced.

Every failure to spawn, start, answer in time or stay alive is a `ToolServerError`: a system
error of the attempt (re-run), never a 0. The server's stderr is kept in a temporary file and
its last lines are quoted in that error. The SDK does not expose the process, so the command
runs under a one-line `sh` that writes the server's exit status to that stderr when it ends:
a server that dies says "exited with status 1" and its last stderr lines, not the SDK's
"unhandled errors in a TaskGroup".
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import re
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from tbhpc.errors import InfraError


class ToolServerError(InfraError):
    """A tool server failed to start, answer in time, or stay alive."""

    kind = "tool_server"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    reuse: bool = False               # `__reserved__init` resets it fully: one process may serve many attempts
    spare: int = 1                    # processes started ahead, per worker process
    startup_timeout_s: float = 60.0


# Runs the server as a child of `sh` (same process group, same pipes) and reports how it ended.
_EXIT_REPORTER = '"$@"; status=$?; echo "[tbhpc] the server exited with status $status" >&2; exit $status'
_EXIT_LINE = re.compile(r"\[tbhpc\] the server exited with status (\d+)")

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The worker process's MCP loop (a daemon thread, started on first use)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


class ServerConnection:
    """One server process and its client session; starts on construction, in the background."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.t0 = time.monotonic()
        self.ready_s: float | None = None
        self.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self.failure: BaseException | None = None
        self.calls = 0
        self._ready: Future = Future()
        self._closing = asyncio.Event()
        self._session = None
        self._life = asyncio.run_coroutine_threadsafe(self._run(), event_loop())

    async def _run(self) -> None:
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        params = StdioServerParameters(command="/bin/sh", args=["-c", _EXIT_REPORTER, self.spec.name, self.spec.command,
                                                               *self.spec.args],
                                       env=dict(self.spec.env) or None, cwd=self.spec.cwd)
        try:
            async with stdio_client(params, errlog=self.stderr) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self._session = session
                    self.ready_s = time.monotonic() - self.t0
                    self._ready.set_result(self.ready_s)
                    await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - recorded; raised to callers as ToolServerError
            self.failure = exc
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            self._session = None

    @property
    def alive(self) -> bool:
        return self.failure is None and not self._life.done()

    def wait_ready(self) -> None:
        try:
            self._ready.result(self.spec.startup_timeout_s)
        except FutureTimeout:
            self.close()
            raise ToolServerError(f"tool server {self.spec.name}: not ready after {self.spec.startup_timeout_s:.0f}s"
                                  f"{self._stderr_tail()}") from None
        except Exception as exc:
            status = self.exit_status(wait_s=2.0)
            if status is not None:
                raise ToolServerError(f"tool server {self.spec.name}: exited with status {status} before it was ready"
                                      f"{self._stderr_tail()}") from None
            raise ToolServerError(f"tool server {self.spec.name}: failed to start{self._stderr_tail()}",
                                  _innermost(exc)) from None

    def exit_status(self, wait_s: float = 0.0) -> int | None:
        """The server's exit status once it has ended (None while it runs, or if unknown after `wait_s`)."""
        deadline = time.monotonic() + wait_s
        while True:
            match = _EXIT_LINE.search(self._stderr_text())
            if match or time.monotonic() >= deadline:
                return int(match.group(1)) if match else None
            time.sleep(0.05)

    def ping(self, timeout_s: float = 10.0) -> None:
        self._wait(self._request(lambda s: s.send_ping()), "ping", timeout_s)

    def list_tools(self, timeout_s: float = 30.0) -> list:
        return self._wait(self._request(lambda s: s.list_tools()), "list_tools", timeout_s).tools

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
        """The tool's text output and whether the server flagged it as an error."""
        self.calls += 1
        result = self._wait(self._request(lambda s: s.call_tool(name, arguments, read_timeout_seconds=_read_timeout(timeout_s))),
                            name, timeout_s + 5.0)
        text = "".join(getattr(c, "text", "") for c in result.content)
        return text, bool(sdk_field(result, "is_error", "isError"))

    def close(self) -> None:
        """Close stdin and let the SDK stop the process (non-blocking)."""
        try:
            event_loop().call_soon_threadsafe(self._closing.set)
        except RuntimeError:  # loop already closed at interpreter exit
            pass

    def _request(self, make):
        async def run():
            if self._session is None:
                raise ConnectionError("no session")
            return await make(self._session)
        return asyncio.run_coroutine_threadsafe(run(), event_loop())

    def _wait(self, fut, what: str, timeout_s: float):
        try:
            return fut.result(timeout_s)
        except FutureTimeout:
            fut.cancel()
            self.failure = self.failure or TimeoutError(what)
            raise ToolServerError(f"tool server {self.spec.name}: {what} got no answer in {timeout_s:.0f}s") from None
        except Exception as exc:
            self.failure = self.failure or exc
            dead = ""
            if not self.alive:
                status = self.exit_status(wait_s=1.0)
                dead = f" (the server {'has stopped' if status is None else f'exited with status {status}'})"
            raise ToolServerError(f"tool server {self.spec.name}: {what} failed{dead}{self._stderr_tail()}", exc) from None

    def _stderr_text(self) -> str:
        try:
            self.stderr.flush()
            self.stderr.seek(0)
            return self.stderr.read()
        except (OSError, ValueError):
            return ""

    def _stderr_tail(self, lines: int = 3) -> str:
        tail = [ln for ln in self._stderr_text().splitlines() if ln.strip() and not _EXIT_LINE.search(ln)][-lines:]
        return f" (stderr: {' | '.join(tail)[:500]})" if tail else ""


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (the SDK's task groups wrap the real cause)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class ServerPool:
    """Started-ahead processes of one server, shared by one worker process's episode threads."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self._idle: deque[ServerConnection] = deque()
        self._lock = threading.Lock()
        self.started = 0
        self.tools: list | None = None      # the server's tool list (static per command), listed once

    def acquire(self) -> ServerConnection:
        """A ready process: a started-ahead one, or a new one if none is idle or the idle one died."""
        with self._lock:
            conn = self._idle.popleft() if self._idle else None
            while conn is not None and conn.failure is not None:      # died while idle
                conn = self._idle.popleft() if self._idle else None
            spare = conn is not None
            if conn is None:
                conn = self._start()
            while len(self._idle) < self.spec.spare:
                self._idle.append(self._start())
        try:
            conn.wait_ready()
            if spare:
                conn.ping()               # an idle process may have died unnoticed (killed, out of memory)
        except ToolServerError:
            if not spare:
                raise
            conn.close()
            conn = self._start()          # the started-ahead process is gone: one cold retry
            conn.wait_ready()
        return conn

    def release(self, conn: ServerConnection, healthy: bool) -> None:
        with self._lock:
            if self.spec.reuse and healthy and conn.alive and len(self._idle) < self.spec.spare + 1:
                self._idle.appendleft(conn)     # warm and proven: taken before a freshly started one
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            while self._idle:
                self._idle.popleft().close()

    def _start(self) -> ServerConnection:
        self.started += 1
        return ServerConnection(self.spec)


_POOLS: list[ServerPool] = []


def register(pool: ServerPool) -> ServerPool:
    _POOLS.append(pool)
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS:
        pool.close()
    if _POOLS:
        time.sleep(0.05)   # let the loop deliver the closes; the SDK then stops each process


# The MCP SDK 2.x renamed fields (inputSchema -> input_schema, isError -> is_error) and takes the
# read timeout in seconds, where 1.x takes a timedelta. tbhpc runs on 2.x; `tbhpc openenv-serve`
# runs beside openenv, whose fastmcp 3 pins 1.x, and serves ThinkingBox sources through this client.
def sdk_field(obj: Any, name: str, legacy: str) -> Any:
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, legacy, None)


def _read_timeout(seconds: float):
    if _sdk_major() >= 2:
        return seconds
    from datetime import timedelta
    return timedelta(seconds=seconds)


@functools.cache
def _sdk_major() -> int:
    from importlib.metadata import version
    return int(version("mcp").split(".")[0])
