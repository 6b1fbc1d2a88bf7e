"""Rule reward for the toy addition task (self-contained: verl loads this file by path).

verl 0.9.1 decodes the response with ``skip_special_tokens=True`` (reward loop
``NaiveRewardManager.run_single``), so EOS is normally already stripped; when a
decoder keeps special tokens, everything from the first special token on is cut.
``"7"`` therefore means "7 then EOS" (or "7" truncated at max_response_length).

The graded answer is the text after the last ``?``: ``?`` is the toy task's correction marker, the analogue of
grading the *last* ``\\boxed{}`` in EDGE-GRPO. A reply "3?12" to "5+7=?" (a wrong first answer, the cue, then the
right one, as Guided Error Correction builds them with ``cue: "?"`` and ``answer_template: "?{answer}"``) is
correct; "12" alone is correct too.

``compute_score`` returns a dict. verl uses ``result["score"]`` as the reward and
logs every key as reward-extra info; validation reports
``val-core/<data_source>/acc/mean@N`` (``acc`` is the core variable when present)
and ``val-aux/<data_source>/{score,format}/...``. All values are floats and every
call returns the same keys (verl stacks them per sample).

``compute_score`` (the default) is exact match: score == acc in {0, 1}. With it
every two-digit group (``toy_add2``) is all-wrong with identical rewards, i.e.
exactly zero GRPO advantage -- the case Guided Error Correction is meant to rescue.
A torch-only GRPO check from the warmed-up model (16 prompts x 8, lr 1e-3,
150 steps) raised one-digit acc 0.30 -> ~0.5-0.6 with it, while 100% of the
two-digit groups stayed collapsed.

``compute_score_shaped`` adds format shaping (max 1.0):
  +0.1  response starts with a digit
  +0.2  response is all digits with the answer's length
  +0.7  exact answer
No partial credit for a correct *first* digit (that would let a one-digit "1"
score on every two-digit sum). The shaping does leak format signal into the
two-digit groups (non-digit starts score 0, two-digit-long replies 0.3), so
they are not all reward-identical: only ~40-80% collapsed in the same check,
with one-digit learning about the same (0.33 -> 0.5).
"""

from __future__ import annotations

import re

_SPECIAL_RE = re.compile(r"<\|endoftext\|>|<\|im_end\|>|<\|im_start\|>|<pad>")


def _clean(solution_str: str) -> str:
    m = _SPECIAL_RE.search(solution_str)
    if m is not None:
        solution_str = solution_str[: m.start()]
    return solution_str.strip()


def _parts(solution_str: str, ground_truth) -> tuple[float, float, float]:
    gt = str(ground_truth).strip()
    resp = _clean(solution_str or "").rsplit("?", 1)[-1].strip()  # the final answer
    starts_digit = float(bool(resp) and resp[0].isdigit())
    fmt = float(resp.isdigit() and len(resp) == len(gt))
    acc = float(resp == gt)
    return starts_digit, fmt, acc


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Exact match (score == acc), plus the format indicator for logging."""
    _, fmt, acc = _parts(solution_str, ground_truth)
    return {"score": acc, "acc": acc, "format": fmt}


def compute_score_shaped(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Shaped score (see module docstring) plus separately logged exact-match accuracy."""
    starts_digit, fmt, acc = _parts(solution_str, ground_truth)
    score = round(0.1 * starts_digit + 0.2 * fmt + 0.7 * acc, 6)
    return {"score": float(score), "acc": acc, "format": fmt}
