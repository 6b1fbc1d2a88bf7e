"""math-verify in a separate, killable process: the part of the boxed-math reward that can hang.

``math_verify.parse``/``verify`` call sympy, which can run for minutes on answers such as ``9^{9^{9^{9}}}``.
math-verify's own timeout uses ``signal.alarm``, which works only in a process's main thread, while verl scores
in thread pools inside Ray workers. So the reward (``verl_ext.rewards.math``) runs this file as a child process
(``subprocess_pool.SubprocessPool``), turns math-verify's timeouts off, and bounds each answer from outside by
killing the child when it overruns.

Run as a script (``python math_verify_worker.py MEMORY_LIMIT_MB``) it serves one request per line on stdin,
``{"pred": str, "gts": [str, ...], "hard_limit_s": int}``, and answers one line per request on its original
stdout, ``{"correct": bool}`` or ``{"error": str}``. It imports only the standard library and math-verify (not
verl, not torch), so a replacement starts in about a second. Stray prints go to stderr, never into the protocol.
It exits when stdin closes or its parent process goes away, and a request that overruns ``hard_limit_s`` kills
it (SIGALRM with the default action) even if the parent is gone.
"""

import sys

if __name__ == "__main__":
    # Run as a script, Python puts this file's folder first on sys.path; that folder holds the reward's
    # ``math.py``, which would shadow the standard library's ``math`` for sympy.
    sys.path.pop(0)

import json
import os

READY = {"ready": True}


def math_verify_equal(pred: str, gts: list) -> bool:
    """math-verify's equivalence of one extracted answer with any of the ground truths (no timeouts inside).

    Both sides are wrapped in ``\\boxed{}`` so math-verify parses exactly the given answer (not other numbers
    it might find in a longer text).
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = (LatexExtractionConfig(), ExprExtractionConfig())
    pred_parsed = parse("\\boxed{" + pred + "}", targets, parsing_timeout=None)
    if not pred_parsed:
        return False
    for gt in gts:
        gold = parse("\\boxed{" + gt + "}", targets, parsing_timeout=None)
        if gold and verify(gold, pred_parsed, timeout_seconds=None):
            return True
    return False


def _quiet_math_verify_logs() -> None:
    import logging

    # math-verify warns once per process that its timeout is off: here that is the point
    for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _limit_memory(limit_mb: int) -> None:
    if limit_mb <= 0:
        return
    try:
        import resource

        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # not available on this OS: the parent's timeout still bounds time
        pass


class _LineReader:
    """Lines from a raw fd, polling so the worker can notice its parent going away while idle."""

    def __init__(self, fd: int):
        import select

        self.fd, self.buf = fd, b""
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN | select.POLLHUP)

    def readline(self, parent_pid: int):
        while b"\n" not in self.buf:
            if not self.poller.poll(1000):
                if os.getppid() != parent_pid:
                    return None  # orphaned
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None  # stdin closed: the pool is shutting this worker down
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def main(argv: list) -> None:
    import signal

    memory_limit_mb = int(argv[1]) if len(argv) > 1 else 0
    parent_pid = os.getppid()
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed from now on goes to stderr, not into the protocol
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # an overrunning request kills the process outright

    _quiet_math_verify_logs()
    import math_verify  # noqa: F401  (import before answering "ready": the parent times the startup)

    _limit_memory(memory_limit_mb)

    def answer(obj) -> None:
        os.write(out_fd, json.dumps(obj).encode() + b"\n")

    answer(READY)
    reader = _LineReader(0)
    while True:
        line = reader.readline(parent_pid)
        if line is None:
            return
        try:
            request = json.loads(line)
            signal.alarm(max(1, int(request.get("hard_limit_s", 60))))
            try:
                response = {"correct": bool(math_verify_equal(str(request["pred"]), list(request["gts"])))}
            finally:
                signal.alarm(0)
        except MemoryError:
            response = {"error": "MemoryError"}
        except Exception as e:  # math-verify/sympy failures on odd input: graded wrong by the caller
            response = {"error": f"{type(e).__name__}: {e}"[:500]}
        answer(response)


if __name__ == "__main__":
    main(sys.argv)
