"""A pool of child processes that answer JSON-line requests, with a time bound per request that works anywhere.

Why not ``concurrent.futures.ProcessPoolExecutor`` (what ``verl.utils.reward_score.math_verify`` uses):
``future.result(timeout)`` stops waiting but leaves the call running in its worker; a truly stuck call keeps
that worker forever, and once every worker is stuck, every later answer times out. Here a request that
overruns its time is answered by killing its process (SIGKILL, then reaped) and starting a fresh one for the
next request, so a hang costs one timeout and one restart, and nothing stays behind.

It uses no signals in the calling process, so it works from any thread (verl scores in thread pools inside Ray
workers). Processes start lazily, up to ``max_workers``, and are reused. A process started by ``fork`` (e.g. a
data-loader worker) gets its own pool: the pipes of the parent's workers are never shared.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Sequence


class WorkerTimeout(Exception):
    """The request ran past its time; its process was killed."""


class WorkerCrashed(Exception):
    """The process died or sent garbage while answering (e.g. out of memory, a native crash)."""


class WorkerStartupError(RuntimeError):
    """A worker process could not start (broken installation): raised loudly, it is not a bad answer."""


class _Worker:
    def __init__(self, argv: Sequence[str], startup_timeout: float):
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._fd = self.proc.stdout.fileno()
        self._buf = b""
        self._poller = select.poll()  # poll, not select: fds above 1024 are common in Ray workers
        self._poller.register(self._fd, select.POLLIN | select.POLLHUP)
        try:
            hello = self.read(startup_timeout)
        except (WorkerTimeout, WorkerCrashed) as e:
            self.kill()
            raise WorkerStartupError(f"worker {list(argv)} did not start within {startup_timeout:.0f} s: {e!r}") from e
        if hello.get("ready") is not True:
            self.kill()
            raise WorkerStartupError(f"worker {list(argv)} sent {hello!r} instead of its ready line")

    def send(self, obj: dict) -> None:
        data = memoryview(json.dumps(obj).encode() + b"\n")
        try:
            while data:
                data = data[os.write(self.proc.stdin.fileno(), data):]
        except OSError as e:  # BrokenPipeError included
            raise WorkerCrashed(f"worker is gone: {e!r}") from e

    def read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout(f"no answer within {timeout:.3g} s")
            if not self._poller.poll(max(1, int(remaining * 1000))):
                continue
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise WorkerCrashed(f"worker exited (returncode {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError as e:
            raise WorkerCrashed(f"unreadable answer {line[:200]!r}") from e

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self._reap(timeout=10)

    def close(self) -> None:
        """Ask the worker to exit (stdin EOF); kill it if it does not."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def _reap(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # SIGKILL cannot be ignored; a zombie-in-waiting is left to the OS
            pass
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class SubprocessPool:
    """Up to ``max_workers`` processes running ``argv``; ``request(obj, timeout)`` is thread-safe."""

    def __init__(self, argv: Sequence[str], max_workers: int, startup_timeout: float = 120.0):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.argv, self.max_workers, self.startup_timeout = list(argv), int(max_workers), float(startup_timeout)
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._pid = os.getpid()
        self.started = 0  # processes started so far (restarts after a kill included)
        self.killed = 0  # processes killed after a timeout or crash
        self._closed = False

    def request(self, obj: dict, timeout: float) -> dict:
        """Send ``obj`` to an idle worker and return its answer; the answer's time alone is bounded by ``timeout``.

        Raises WorkerTimeout (the worker was killed) or WorkerCrashed. Waiting for a free worker is not
        counted: it is bounded by the other requests' own timeouts.
        """
        if self._closed:
            raise RuntimeError("SubprocessPool is closed")
        with self._slots:
            worker = self._take()
            answered = False
            try:
                worker.send(obj)
                answer = worker.read(timeout)
                answered = True
                return answer
            finally:
                with self._lock:
                    self._busy.discard(worker)
                    if answered:
                        self._idle.append(worker)
                if not answered:
                    self.killed += 1
                    worker.kill()

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    self._busy.add(worker)
                    return worker
                worker.kill()  # died while idle (e.g. killed from outside): replace it
        worker = _Worker(self.argv, self.startup_timeout)
        with self._lock:
            self.started += 1
            self._busy.add(worker)
        return worker

    @property
    def alive(self) -> int:
        with self._lock:
            return sum(w.proc.poll() is None for w in (*self._idle, *self._busy))

    def close(self) -> None:
        """Stop all idle workers (busy ones are killed by their own request's timeout or finish first)."""
        if os.getpid() != self._pid:  # a forked copy: the processes belong to the parent
            return
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def owned_by_this_process(self) -> bool:
        return os.getpid() == self._pid


_pools: dict[tuple, SubprocessPool] = {}
_pools_lock = threading.Lock()


def shared_pool(argv: Sequence[str], max_workers: int, startup_timeout: float = 120.0) -> SubprocessPool:
    """One pool per (argv, max_workers) in this process, closed at exit; a forked child gets a fresh one."""
    key = (tuple(argv), int(max_workers))
    with _pools_lock:
        pool: SubprocessPool | None = _pools.get(key)
        if pool is None or not pool.owned_by_this_process():
            pool = SubprocessPool(argv, max_workers, startup_timeout)
            _pools[key] = pool
        return pool


@atexit.register
def _close_pools() -> None:
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
