"""Rule reward of the toy's reasoning task (``reason.py``; self-contained: verl loads this file by path).

The graded answer is the text after the *last* ``#`` -- the toy's ``\\boxed{}``, graded as EDGE-GRPO grades the last
boxed answer: the steps before it are not checked, and a reply that corrects itself (``...#13!...#14``, the cue
``!`` then a new solution, or GEC's answer template ``!#{answer}``) is graded on its final answer. Special tokens and
everything after the first one are cut (verl decodes with ``skip_special_tokens=True``, so normally there are none).

``compute_score`` returns ``{"score", "acc", "format"}``, all floats: exact match (score == acc in {0, 1}) and the
format indicator (a ``#`` followed by digits only). verl logs every key per data source.
"""

from __future__ import annotations

import re

_SPECIAL_RE = re.compile(r"<\|endoftext\|>|<\|im_end\|>|<\|im_start\|>|<pad>")
ANSWER_MARK = "#"


def final_answer(solution_str: str) -> str | None:
    """The text after the last ``#`` (stripped); None without a ``#``."""
    text = solution_str or ""
    m = _SPECIAL_RE.search(text)
    if m is not None:
        text = text[: m.start()]
    if ANSWER_MARK not in text:
        return None
    return text.rsplit(ANSWER_MARK, 1)[-1].strip()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Exact match of the final answer (score == acc), plus the format indicator for logging."""
    ans = final_answer(solution_str)
    fmt = float(ans is not None and ans.isdigit())
    acc = float(ans is not None and ans == str(ground_truth).strip())
    return {"score": acc, "acc": acc, "format": fmt}
