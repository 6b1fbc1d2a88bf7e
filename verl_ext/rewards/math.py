"""Boxed-math reward (EDGE-GRPO's reward, docs/edge-grpo.md "Reward and evaluation") for verl's custom reward function, graded with math-verify.

Use it with ``reward.custom_reward_function.path=pkg://verl_ext.rewards.math`` (``name`` defaults to
``compute_score``); options go in ``+reward.custom_reward_function.reward_kwargs.<option>=<value>`` (verl passes
them to every call, in the reward loop and in the GEC agent loop alike).

Grading, as in the original (``understand_r1_zero.math_grader.boxed_reward_fn``, which EDGE-GRPO calls):
  * the answer is the content of the *last* ``\\boxed{...}``, found by brace matching (verl's
    ``math_dapo.last_boxed_only_string``); no box, an unclosed box or an empty box is unformatted and wrong;
  * right when it matches the ground truth (or any of a list of them) after MATH's string normalisation
    (verl's ``math_reward.is_equiv``, the "mathd" check) or by math-verify's equivalence (sympy). The original's
    third check, PRM800K's sympy grader, is subsumed by math-verify and not repeated.

Scale (``scale``):
  * ``checked`` (default): ``score = format + acc`` in {0, 1, 2}, the format term really checked (a box with
    content). This fixes the original's format reward, which always returned 1.
  * ``original``: ``score = 1 + acc`` in {1, 2} and ``format`` always 1, exactly the original's total reward.
``acc`` is 0/1 on both scales and is what tells right from wrong (GEC, validation's ``val-core/<source>/acc``).

Bounded time per answer: math-verify runs in child processes (``math_verify_worker.py``) with its own
signal-based timeouts off; an answer that takes longer than ``timeout_s`` is scored wrong, its process is killed
and replaced, and ``grader_failed`` is 1 for that sample (verl logs it per data source). No exception from a bad
output reaches verl. Other options: ``max_answer_chars`` (longer boxed answers are wrong without grading; the
original likewise refused long repetitive answers), ``grader_workers`` (processes per scoring process),
``grader_memory_mb`` (address-space cap of each grader process, 0 = none).

Every call returns the same keys, all floats: ``score``, ``acc``, ``format``, ``grader_failed``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any

from verl.utils.reward_score.math_dapo import last_boxed_only_string, remove_boxed
from verl.utils.reward_score.math_reward import is_equiv

from verl_ext.rewards.subprocess_pool import (
    WorkerCrashed,
    WorkerTimeout,
    shared_pool,
)

logger = logging.getLogger(__name__)

SCALES = ("checked", "original")
DEFAULT_SCALE = "checked"
DEFAULT_TIMEOUT_S = 5.0  # math-verify's own default per parse/compare
DEFAULT_MAX_ANSWER_CHARS = 1000
DEFAULT_GRADER_WORKERS = max(1, min(4, os.cpu_count() or 1))
DEFAULT_GRADER_MEMORY_MB = 4096

OPTION_PREFIX = "reward.custom_reward_function.reward_kwargs"
WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "math_verify_worker.py")
# what verl's reward managers may pass besides the reward_kwargs; accepted and ignored
_VERL_CALL_KWARGS = {"reward_router_address", "reward_model_tokenizer", "sandbox_fusion_url",
                     "concurrent_semaphore", "memory_limit_mb"}
_warned_unknown: set[str] = set()


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (brace matching), or None when there is none or it is not closed."""
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


def ground_truths(ground_truth: Any) -> list[str]:
    """The accepted answers as strings: a list (or array) gives several; ``\\boxed{x}`` and ``$x$`` give x."""
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    items = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    out = []
    for item in items:
        if item is None:
            continue
        text = str(item).strip()
        if "\\boxed{" in text:
            text = (extract_boxed_answer(text) or text).strip()
        if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
            text = text.strip("$").strip()
        if text:
            out.append(text)
    return out


def _check_options(scale, timeout_s, max_answer_chars, grader_workers, grader_memory_mb) -> None:
    def bad(name, value, allowed):
        raise ValueError(f"{OPTION_PREFIX}.{name}={value!r}: {allowed}")

    if scale not in SCALES:
        bad("scale", scale, f"must be one of {list(SCALES)}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        bad("timeout_s", timeout_s, "must be a number > 0 (seconds per answer)")
    if not (isinstance(max_answer_chars, int) and max_answer_chars >= 1):
        bad("max_answer_chars", max_answer_chars, "must be an integer >= 1")
    if not (isinstance(grader_workers, int) and grader_workers >= 1):
        bad("grader_workers", grader_workers, "must be an integer >= 1")
    if not (isinstance(grader_memory_mb, int) and grader_memory_mb >= 0):
        bad("grader_memory_mb", grader_memory_mb, "must be an integer >= 0 (0: no cap)")


def _warn_unknown(kwargs: dict) -> None:
    for key in kwargs:
        if key not in _VERL_CALL_KWARGS and key not in _warned_unknown:
            _warned_unknown.add(key)
            logger.warning("verl_ext.rewards.math: ignoring unknown option %s.%s (known: scale, timeout_s, "
                           "max_answer_chars, grader_workers, grader_memory_mb)", OPTION_PREFIX, key)


def grader_pool(workers: int = DEFAULT_GRADER_WORKERS, memory_mb: int = DEFAULT_GRADER_MEMORY_MB):
    """This process's pool of math-verify processes (started lazily, shared by all threads)."""
    return shared_pool([sys.executable, WORKER_PATH, str(int(memory_mb))], workers)


def grade_answer(answer: str, gts: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS, grader_workers: int = DEFAULT_GRADER_WORKERS,
                 grader_memory_mb: int = DEFAULT_GRADER_MEMORY_MB) -> tuple[float, float]:
    """``(acc, grader_failed)`` of one extracted answer against the accepted ground truths."""
    if not gts or len(answer) > max_answer_chars:
        return 0.0, 0.0
    if any(is_equiv(answer, gt) for gt in gts):  # string normalisation: cheap, bounded, in this process
        return 1.0, 0.0
    request = {"pred": answer, "gts": gts, "hard_limit_s": math.ceil(timeout_s) + 5}
    try:
        reply = grader_pool(grader_workers, grader_memory_mb).request(request, timeout=timeout_s)
    except WorkerTimeout:
        logger.warning("math-verify took over %.3g s on the answer %.200r; scored wrong", timeout_s, answer)
        return 0.0, 1.0
    except WorkerCrashed as e:
        logger.warning("math-verify process died on the answer %.200r (%s); scored wrong", answer, e)
        return 0.0, 1.0
    if "error" in reply:
        logger.warning("math-verify failed on the answer %.200r: %s; scored wrong", answer, reply["error"])
        return 0.0, 1.0
    return (1.0 if reply.get("correct") else 0.0), 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, scale: str = DEFAULT_SCALE,
                  timeout_s: float = DEFAULT_TIMEOUT_S, max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
                  grader_workers: int = DEFAULT_GRADER_WORKERS, grader_memory_mb: int = DEFAULT_GRADER_MEMORY_MB,
                  **kwargs) -> dict:
    """verl custom reward: ``{"score", "acc", "format", "grader_failed"}`` (see the module docstring)."""
    _check_options(scale, timeout_s, max_answer_chars, grader_workers, grader_memory_mb)
    _warn_unknown(kwargs)
    answer = extract_boxed_answer(solution_str if isinstance(solution_str, str) else str(solution_str or ""))
    boxed = answer is not None and answer.strip() != ""
    acc = failed = 0.0
    if boxed:
        acc, failed = grade_answer(answer.strip(), ground_truths(ground_truth), timeout_s=timeout_s,
                                   max_answer_chars=max_answer_chars, grader_workers=grader_workers,
                                   grader_memory_mb=grader_memory_mb)
    fmt = 1.0 if scale == "original" else float(boxed)
    return {"score": fmt + acc, "acc": acc, "format": fmt, "grader_failed": failed}
