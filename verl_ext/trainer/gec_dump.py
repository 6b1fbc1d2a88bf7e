"""What GEC wrote, in verl's rollout dump (``trainer.rollout_data_dir``): extra columns for each dumped line.

verl's ``_dump_generations`` (legacy and v1 trainers) writes one JSON line per training response with the prompt
(``input``), the final response text (``output``), the ground truth (``gts``), the final score (``score``) and the
step; any list of per-row values it is handed next to them becomes a key of the line too.  With GEC on, the
trainers (``legacy.py``, ``v1.py``) hand it the columns built here from the ``gec_agent`` loop's per-sample fields
(``verl_ext.rollout.gec``), decoded on the driver only when the dump is on:

  * ``gec_branch``, ``gec_score_before``, ``gec_correct_before``: the branch and the first response's score
    (``score`` is the final one, after correction);
  * ``gec_first_response``: the policy's first response, as text;
  * ``gec_segments``: the final response in pieces, ``[{"kind", "text", "tokens"}]`` (kinds:
    ``verl_ext.rollout.gec.SPAN_KINDS``: policy, cue, continuation, answer, solution, eos);
  * ``gec_group`` (the group's uid) and ``data_source``, so a reader can put a group back together.

``python -m verl_ext.report RUN --samples`` renders these lines as a page (``verl_ext.report_samples``).
"""

from __future__ import annotations

from collections.abc import Callable

from verl_ext.rollout.gec import (
    EXTRA_KEYS,
    KEY_BRANCH,
    KEY_CORRECT_BEFORE,
    KEY_FIRST_RESPONSE_IDS,
    KEY_SCORE_BEFORE,
    KEY_SPANS,
    SPAN_POLICY,
)
from verl_ext.trainer.gec_metrics import gec_columns

DUMP_BRANCH = "gec_branch"
DUMP_SCORE_BEFORE = "gec_score_before"
DUMP_CORRECT_BEFORE = "gec_correct_before"
DUMP_FIRST_RESPONSE = "gec_first_response"
DUMP_SEGMENTS = "gec_segments"
DUMP_GROUP = "gec_group"
DUMP_DATA_SOURCE = "data_source"


def _ids(row) -> list[int]:
    if hasattr(row, "tolist"):
        row = row.tolist()
    return [int(t) for t in row]


def _scalar(value):
    return value.item() if hasattr(value, "item") else value


def gec_dump_columns(non_tensor_batch: dict, responses, uid, data_source,
                     batch_decode: Callable[[list[list[int]]], list[str]]) -> dict[str, list] | None:
    """Per-row columns for verl's ``_dump_generations`` (module docstring); None when no row has GEC fields.

    Args:
        non_tensor_batch: the step's non-tensor columns: flat ``gec_*`` columns (legacy) or ``extra_fields`` (v1).
        responses: the final response ids per row (rows may be right-padded: only the spans are read).
        uid: the group uid per row.
        data_source: the data source per row (None: not known).
        batch_decode: lists of token ids -> texts (the tokenizer's, skipping special tokens, as verl's dump).

    Returns:
        ``{column: [value per row]}``; rows without GEC fields (another agent loop) get None cells. The first
        response is the row's kept ids (``gec_first_response_ids``) when it has them, else the final response's
        leading ``policy`` piece (the first response less its trailing EOS/padding, which the decode drops anyway);
        "" when the final response starts with no policy token.
    """
    n = len(responses)
    cols = gec_columns(non_tensor_batch, n, keys=EXTRA_KEYS + (KEY_FIRST_RESPONSE_IDS,))
    if cols is None:
        return None
    pieces: list[list[int]] = []  # every piece of every row, decoded in one batch
    plan = []  # per row: None, or (segment piece indices, kinds, token counts, first-response piece index)
    for i in range(n):
        spans = cols[KEY_SPANS][i]
        if cols[KEY_BRANCH][i] is None or spans is None:
            plan.append(None)
            continue
        ids = _ids(responses[i])
        seg = []
        for kind, s, e in spans:
            seg.append((len(pieces), str(kind), int(e) - int(s)))
            pieces.append(ids[int(s):int(e)])
        first = cols[KEY_FIRST_RESPONSE_IDS][i]
        if first is not None:
            first_at = len(pieces)
            pieces.append(_ids(first))
        elif spans and spans[0][0] == SPAN_POLICY and int(spans[0][1]) == 0:
            first_at = seg[0][0]
        else:
            first_at = None
        plan.append((seg, first_at))
    texts = batch_decode(pieces) if pieces else []
    out = {DUMP_BRANCH: [], DUMP_SCORE_BEFORE: [], DUMP_CORRECT_BEFORE: [], DUMP_FIRST_RESPONSE: [],
           DUMP_SEGMENTS: [], DUMP_GROUP: [str(_scalar(u)) for u in uid],
           DUMP_DATA_SOURCE: [None if data_source is None else str(_scalar(d)) for d in
                              (data_source if data_source is not None else [None] * n)]}
    for i, row_plan in enumerate(plan):
        if row_plan is None:  # a row another agent loop wrote
            for key in (DUMP_BRANCH, DUMP_SCORE_BEFORE, DUMP_CORRECT_BEFORE, DUMP_FIRST_RESPONSE, DUMP_SEGMENTS):
                out[key].append(None)
            continue
        seg, first_at = row_plan
        score, correct = cols[KEY_SCORE_BEFORE][i], cols[KEY_CORRECT_BEFORE][i]
        out[DUMP_BRANCH].append(str(cols[KEY_BRANCH][i]))
        out[DUMP_SCORE_BEFORE].append(None if score is None else float(_scalar(score)))
        out[DUMP_CORRECT_BEFORE].append(None if correct is None else bool(_scalar(correct)))
        out[DUMP_FIRST_RESPONSE].append("" if first_at is None else texts[first_at])
        out[DUMP_SEGMENTS].append([{"kind": kind, "text": texts[k], "tokens": count} for k, kind, count in seg])
    return out


def blank_rows(columns: dict[str, list], rows) -> dict[str, list]:
    """``columns`` of the ``rows`` subset ((B,) bool) laid out over all B rows, None in the others (v1: verl's
    padding rows, which copy row 0's fields)."""
    rows = [bool(r) for r in rows]
    if all(rows):
        return columns
    out = {}
    for name, values in columns.items():
        it = iter(values)
        out[name] = [next(it) if r else None for r in rows]
    return out
