"""GEC's per-step training metrics (``gec/...``) and the all-wrong groups per data source (``verl_ext/...``),
computed on the driver from the fields the ``gec_agent`` loop wrote for each sample (``verl_ext.rollout.gec.EXTRA_KEYS``)
and the rewards; both trainers log them with any ``adv_estimator``.

numpy, with ``verl_ext.algos.groups`` for the groups (torch tensors are accepted and converted); no verl import.
"""

from __future__ import annotations

import numpy as np
import torch

from verl_ext.algos.groups import first_member, group_ids
from verl_ext.rollout.gec import (
    BRANCH_REFLECT,
    BRANCHES,
    EDIT_BRANCHES,
    EXTRA_KEYS,
    KEY_BRANCH,
    KEY_CONTINUATION_TOKENS,
    KEY_CORRECT_BEFORE,
    KEY_ERROR,
    KEY_FIRST_HIT_CAP,
    KEY_INJECTED_TOKENS,
    KEY_SCORE_BEFORE,
    KEY_TRUNCATED,
    reward_acc,
)


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().float().numpy()
    return np.asarray(x)


def _uids_and_scores(uid, final_scores, caller: str) -> tuple[np.ndarray, np.ndarray]:
    """The step's group ids and final sequence scores as arrays, one per row (a length mismatch is an error)."""
    uid = np.asarray(list(uid), dtype=object)
    scores = _as_numpy(final_scores).astype(np.float64).reshape(-1)
    if len(uid) != len(scores):
        raise ValueError(f"{caller}: {len(uid)} uids for {len(scores)} final scores")
    return uid, scores


def _group_codes(uid) -> tuple[np.ndarray, int]:
    """Dense group ids (first appearance order) of the rows' uids, as ``algos.groups.group_ids`` builds them."""
    gid, groups = group_ids(np.asarray(uid, dtype=object))
    return gid.numpy(), groups


def _group_any(flags: np.ndarray, gid: np.ndarray, groups: int) -> np.ndarray:
    return np.bincount(gid, weights=flags.astype(np.float64), minlength=groups) > 0


def _group_all_equal(values: np.ndarray, gid: np.ndarray, groups: int) -> np.ndarray:
    """Per group: all values identical (a NaN makes a group unequal)."""
    low = np.full(groups, np.inf)
    high = np.full(groups, -np.inf)
    np.minimum.at(low, gid, values)
    np.maximum.at(high, gid, values)
    return low == high


def gec_columns(non_tensor_batch: dict, n: int, keys=EXTRA_KEYS) -> dict[str, list] | None:
    """The per-sample GEC fields ``keys``, from flat columns (legacy trainer) or from v1's ``extra_fields`` dicts;
    None when no row has GEC fields."""
    if KEY_BRANCH in non_tensor_batch:
        return {k: list(non_tensor_batch[k]) if k in non_tensor_batch else [None] * n for k in keys}
    extra = non_tensor_batch.get("extra_fields")
    if extra is None:
        return None
    rows = [getattr(r, "data", r) for r in list(extra)]
    if not any(isinstance(r, dict) and KEY_BRANCH in r for r in rows):
        return None
    return {k: [r.get(k) if isinstance(r, dict) else None for r in rows] for k in keys}


def _final_acc(non_tensor_batch: dict, n: int) -> list[bool | None]:
    """Per row: correctness from the final reward's ``acc`` (see ``verl_ext.rollout.gec.reward_acc``), None where there is none.

    Legacy trainer: reward-extra keys are columns (``score``, ``acc``, ...);
    v1: ``extra_fields[i]["reward_extra_info"]``.
    """
    if "acc" in non_tensor_batch and "score" in non_tensor_batch:
        return [reward_acc({"score": s, "acc": a}) for s, a in zip(non_tensor_batch["score"], non_tensor_batch["acc"])]
    extra = non_tensor_batch.get("extra_fields")
    if extra is not None:
        rows = [getattr(r, "data", r) for r in list(extra)]
        return [reward_acc(r.get("reward_extra_info")) if isinstance(r, dict) else None for r in rows]
    return [None] * n


def gec_step_metrics(non_tensor_batch: dict, uid, final_scores, correct_threshold: float = 1.0) -> dict[str, float]:
    """GEC metrics of one training step, keys prefixed ``gec/``.

    Args:
        non_tensor_batch: the batch's non-tensor columns; either flat ``gec_*`` columns (legacy trainer:
            ``AgentLoopWorker._postprocess`` turns every extra field into a column) or an ``extra_fields``
            column of per-sample dicts (v1 / TransferQueue). Rows without GEC fields (another agent loop,
            validation) are ignored.
        uid: group id per row (verl's ``uid`` column).
        final_scores: sequence reward per row after correction (e.g. ``token_level_scores.sum(-1)``).
        correct_threshold: ``algorithm.gec.correct_threshold``; decides the final correctness of rows whose reward
            has no ``acc`` (see ``verl_ext.rollout.gec.response_is_correct``; the before side uses the recorded ``gec_correct_before``).
    Returns {} when the batch holds no GEC rows.

    Keys: acc_before / acc_after (fraction correct), reward_before / reward_after (means), frac_edited,
    count/<branch> for every branch, continuation_tokens (sum) and continuation_tokens_mean (per reflection),
    injected_tokens (sum), truncated (count), first_hit_cap (first generations cut by their budget), errors
    (rows whose data GEC could not use: ``check_gec_errors``), groups,
    groups_all_wrong_before, groups_rescued (all wrong before, both correct and wrong after),
    groups_collapsed_before / groups_collapsed_after (identical scores), responses.
    """
    uid, scores = _uids_and_scores(uid, final_scores, "gec_step_metrics")
    n = len(scores)
    cols = gec_columns(non_tensor_batch, n)
    if cols is None:
        return {}
    branch = cols[KEY_BRANCH]
    rows = np.array([b is not None for b in branch], dtype=bool)
    if not rows.any():
        return {}

    def col(key, default):
        return np.array([default if v is None else v for v in cols[key]], dtype=object)

    before = col(KEY_SCORE_BEFORE, np.nan).astype(np.float64)
    correct_before_raw = cols[KEY_CORRECT_BEFORE]
    correct_before = np.array(
        [bool(c) if c is not None else bool(s >= correct_threshold) for c, s in zip(correct_before_raw, before)]
    )
    acc_after = _final_acc(non_tensor_batch, n)
    correct_after = np.array([a if a is not None else bool(s >= float(correct_threshold))
                              for a, s in zip(acc_after, scores)], dtype=bool)
    first_hit_cap = col(KEY_FIRST_HIT_CAP, False).astype(bool)
    cont = col(KEY_CONTINUATION_TOKENS, 0).astype(np.int64)
    injected = col(KEY_INJECTED_TOKENS, 0).astype(np.int64)
    trunc = col(KEY_TRUNCATED, False).astype(bool)
    branch = np.array([b if b is not None else "" for b in branch], dtype=object)

    m: dict[str, float] = {}
    r = rows
    m["gec/responses"] = float(r.sum())
    m["gec/acc_before"] = float(correct_before[r].mean())
    m["gec/acc_after"] = float(correct_after[r].mean())
    m["gec/reward_before"] = float(np.nanmean(before[r])) if np.isfinite(before[r]).any() else float("nan")
    m["gec/reward_after"] = float(scores[r].mean())
    for b in BRANCHES:
        m[f"gec/count/{b}"] = float(((branch == b) & r).sum())
    edited = np.isin(branch, EDIT_BRANCHES) & r
    m["gec/frac_edited"] = float(edited.sum() / r.sum())
    reflect = (branch == BRANCH_REFLECT) & r
    m["gec/continuation_tokens"] = float(cont[r].sum())
    m["gec/continuation_tokens_mean"] = float(cont[reflect].mean()) if reflect.any() else 0.0
    m["gec/injected_tokens"] = float(injected[r].sum())
    m["gec/truncated"] = float(trunc[r].sum())
    m["gec/first_hit_cap"] = float(first_hit_cap[r].sum())
    m["gec/errors"] = float(sum(bool(e) for e, on in zip(cols[KEY_ERROR], r) if on))

    gid, groups = _group_codes(uid[r])
    correct_before_any = _group_any(correct_before[r], gid, groups)
    correct_after_count = np.bincount(gid, weights=correct_after[r].astype(np.float64), minlength=groups)
    size = np.bincount(gid, minlength=groups)
    all_wrong = ~correct_before_any
    rescued = all_wrong & (correct_after_count > 0) & (correct_after_count < size)
    collapsed_before = _group_all_equal(before[r], gid, groups)
    collapsed_after = _group_all_equal(scores[r], gid, groups)
    m["gec/groups"] = float(groups)
    m["gec/groups_all_wrong_before"] = float(all_wrong.sum())
    m["gec/groups_rescued"] = float(rescued.sum())
    m["gec/groups_collapsed_before"] = float(collapsed_before.sum())
    m["gec/groups_collapsed_after"] = float(collapsed_after.sum())
    return m


# gec_step_metrics' keys that count rows, groups or tokens (besides gec/count/<branch>)
GEC_COUNT_KEYS = frozenset(f"gec/{k}" for k in (
    "responses", "continuation_tokens", "injected_tokens", "truncated", "first_hit_cap", "errors", "groups",
    "groups_all_wrong_before", "groups_rescued", "groups_collapsed_before", "groups_collapsed_after"))


def is_count_metric(name: str) -> bool:
    """A verl_ext metric that counts (a batch of two halves has the halves' sum): GEC's counts and totals, the hint
    mode's (all ``hint/...`` but the per-level accuracies) and every ``*_count`` (e.g. ``edge_grpo/unscaled_count``,
    ``verl_ext/singleton_group_count``)."""
    return (name in GEC_COUNT_KEYS or name.startswith("gec/count/") or name.endswith("_count")
            or (name.startswith("hint/") and not name.endswith("/acc")))


def hint_metrics(non_tensor_batch: dict, uid, n_levels: int) -> dict[str, float]:
    """The hint mode's step metrics (``hints.hint_step_metrics``) from the batch's per-sample fields, legacy columns
    or v1 ``extra_fields``; {} when no row carries them."""
    from verl_ext.rollout.hints import HINT_EXTRA_KEYS, hint_step_metrics

    groups = list(uid)
    cols = gec_columns(non_tensor_batch, len(groups), keys=HINT_EXTRA_KEYS)
    if cols is None:
        return {}
    fields = [dict(zip(cols, values)) for values in zip(*cols.values())]
    return hint_step_metrics(fields, groups, n_levels)


class GecRolloutError(RuntimeError):
    """Too many of a step's GEC training rollouts had row data GEC could not use (``algorithm.gec.max_error_frac``)."""


def check_gec_errors(non_tensor_batch: dict, max_error_frac: float) -> None:
    """Raise :class:`GecRolloutError` when more than ``max_error_frac`` of the batch's GEC rows carry a
    ``gec_error`` (e.g. no ground truth for a drawn answer injection): the run stops at the step that shows it,
    naming the first rows' problems, instead of training on (or, on v1, silently dropping) them."""
    n = len(next(iter(non_tensor_batch.values()))) if non_tensor_batch else 0
    cols = gec_columns(non_tensor_batch, n)
    if cols is None:
        return
    rows = [b is not None for b in cols[KEY_BRANCH]]
    errors = [str(e) for e, on in zip(cols[KEY_ERROR], rows) if on and e]
    total = sum(rows)
    if errors and len(errors) > max_error_frac * total:
        shown = "; ".join(dict.fromkeys(errors[:20]))
        raise GecRolloutError(
            f"GEC: {len(errors)} of {total} training rollouts this step had row data GEC could not use (more than "
            f"algorithm.gec.max_error_frac={max_error_frac}): {shown}. Fix the data (python -m verl_ext.main checks "
            "local parquet files at start-up) or raise algorithm.gec.max_error_frac to train on with them counted "
            "in gec/errors")


def all_wrong_group_metrics(non_tensor_batch: dict, uid, final_scores, data_source=None,
                            correct_threshold: float = 1.0) -> dict[str, float]:
    """Share of groups whose responses are all wrong *before* any correction, overall and per data source.

    The policy's own outcome: ``gec_correct_before`` on GEC rows, else the final reward's ``acc`` (or
    score >= ``correct_threshold``), so the figure means the same with GEC on and off -- the groups GRPO gets no
    signal from and GEC is meant to rescue. Keys ``verl_ext/groups_all_wrong_frac`` and
    ``verl_ext/<data_source>/groups_all_wrong_frac``.
    """
    uid, scores = _uids_and_scores(uid, final_scores, "all_wrong_group_metrics")
    n = len(scores)
    final = _final_acc(non_tensor_batch, n)
    correct = [a if a is not None else bool(s >= float(correct_threshold)) for a, s in zip(final, scores)]
    cols = gec_columns(non_tensor_batch, n)
    if cols is not None:  # GEC rows: the recorded first-response outcome
        correct = [bool(c) if c is not None else f for c, f in zip(cols[KEY_CORRECT_BEFORE], correct)]
    gid, groups = _group_codes(uid)
    wrong = ~_group_any(np.asarray(correct, dtype=bool), gid, groups)
    all_wrong: dict[str | None, list[bool]] = {None: list(wrong)} if groups else {}
    if data_source is not None and groups:
        first = first_member(torch.from_numpy(gid), groups).numpy()
        sources = np.asarray([str(s) for s in data_source], dtype=object)[first]
        for source in dict.fromkeys(sources):  # first appearance order
            all_wrong[source] = list(wrong[sources == source])
    return {("verl_ext" if s is None else f"verl_ext/{s}") + "/groups_all_wrong_frac": float(np.mean(v))
            for s, v in all_wrong.items()}
