"""GEC's credit options (``algorithm.gec.prefix_advantage`` / ``injected_loss``) on a step's advantages: the trainers'
glue (the rules, torch only: ``verl_ext.algos.gec_credit``; docs/gec.md "Credit options").

Both trainers compute a step's advantages through ``advantages_with_credit``, with any ``adv_estimator``:
``pre_correction_batch`` gives the estimator a copy of the batch whose outcomes are the first attempts' rewards r0
(for ``before``), and ``credit_edited_responses`` writes the per-token advantages of the edited responses and, for
``shaped``, the mask of the tokens the actor loss trains off-policy (``OFF_POLICY_MASK_KEY``, read by
``verl_ext.trainer.gec_loss``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from verl import DataProto

from verl_ext.algos.gec_credit import edit_masks, pre_correction_rewards, split_prefix_credit
from verl_ext.rollout.gec import EDIT_BRANCHES, KEY_BRANCH, KEY_SCORE_BEFORE, KEY_SPANS
from verl_ext.trainer.gec_metrics import gec_columns

# (B, T) float per-token field: 1 on injected answer / solution tokens trained with LUFFY's shaped loss
OFF_POLICY_MASK_KEY = "gec_off_policy_mask"


def credit_active(gec) -> bool:
    """Whether GEC's credit options change anything in the trainer (the agent loop handles ``edit_scope``)."""
    return bool(gec.enable) and (gec.prefix_advantage != "after" or gec.injected_loss == "shaped")


def needs_pre_correction(gec) -> bool:
    """Whether the step also runs the estimator on the first attempts' rewards r0 (``prefix_advantage=before``)."""
    return bool(gec.enable) and gec.prefix_advantage == "before"


def _outcomes(data: DataProto) -> torch.Tensor:
    """(B,) each response's outcome as verl scored it (``token_level_scores``; else the rewards' sum)."""
    key = "token_level_scores" if "token_level_scores" in data.batch.keys() else "token_level_rewards"
    return data.batch[key].sum(-1)


def pre_correction_batch(data: DataProto, non_tensor_batch: dict) -> DataProto:
    """A shallow copy of ``data`` whose ``token_level_rewards`` carry the first attempts' rewards r0
    (``gec_score_before``; a row without one keeps its reward), for the estimator's advantage of r0."""
    n = len(data)
    columns = gec_columns(non_tensor_batch, n, keys=(KEY_SCORE_BEFORE,)) or {KEY_SCORE_BEFORE: [None] * n}
    after = _outcomes(data)
    before = torch.tensor([float("nan") if v is None else float(v) for v in columns[KEY_SCORE_BEFORE]],
                          dtype=after.dtype, device=after.device)
    before = torch.where(torch.isfinite(before), before, after)
    copy = DataProto(batch=data.batch.clone(recurse=False), non_tensor_batch=dict(data.non_tensor_batch),
                     meta_info=dict(data.meta_info))
    copy.batch["token_level_rewards"] = pre_correction_rewards(
        data.batch["token_level_rewards"], data.batch["response_mask"], after, before)
    return copy


def credit_edited_responses(data: DataProto, non_tensor_batch: dict, gec, adv_before: torch.Tensor | None = None,
                            rows: np.ndarray | None = None) -> dict[str, float]:
    """Apply ``gec.prefix_advantage`` and ``gec.injected_loss`` to ``data`` (in place); returns the step's metrics.

    Args:
        data: the batch with the estimator's ``advantages`` (from the corrected rewards).
        non_tensor_batch: where GEC's per-row fields are (flat columns, or v1's ``extra_fields``), in row order.
        gec: the run's ``GecConfig``.
        adv_before: (B, T) the estimator's advantages of ``pre_correction_batch`` (``prefix_advantage=before``).
        rows: (B,) bool, the real rows (v1 leaves verl's padding rows out); None: all.

    Returns:
        ``gec/credit/prefix_token_count`` and the mean advantage of those tokens under the paper's rule and under
        the run's (``prefix_adv_paper_mean`` / ``prefix_adv_mean``); ``gec/credit/off_policy_token_count``.
    """
    advantages, mask = data.batch["advantages"], data.batch["response_mask"].bool()
    n, width = advantages.shape
    columns = gec_columns(non_tensor_batch, n, keys=(KEY_BRANCH, KEY_SPANS)) or {KEY_BRANCH: [None] * n,
                                                                              KEY_SPANS: [None] * n}
    edited = np.array([b in EDIT_BRANCHES for b in columns[KEY_BRANCH]], dtype=bool)
    if rows is not None:
        edited &= np.asarray(rows, dtype=bool)
    prefix, off_policy = edit_masks(columns[KEY_SPANS], edited.tolist(), width)
    prefix, off_policy = prefix.to(mask.device) & mask, off_policy.to(mask.device) & mask
    credited = split_prefix_credit(advantages, prefix, gec.prefix_advantage, adv_before)
    metrics = {}
    if gec.prefix_advantage != "after":
        count = int(prefix.sum().item())
        metrics["gec/credit/prefix_token_count"] = float(count)
        if count:
            metrics["gec/credit/prefix_adv_paper_mean"] = advantages[prefix].float().mean().item()
            metrics["gec/credit/prefix_adv_mean"] = credited[prefix].float().mean().item()
    data.batch["advantages"] = credited
    if gec.injected_loss == "shaped":
        data.batch[OFF_POLICY_MASK_KEY] = off_policy.to(advantages.dtype)
        metrics["gec/credit/off_policy_token_count"] = float(off_policy.sum().item())
    return metrics


# an estimator pass: the batch -> the batch with ``advantages`` (and ``returns``) written
EstimatorPass = Callable[[DataProto], DataProto]


def advantages_with_credit(data: DataProto, non_tensor_batch: dict, gec, step_pass: EstimatorPass,
                           prepare_r0_pass: Callable[[], EstimatorPass],
                           rows: np.ndarray | None = None) -> tuple[DataProto, dict[str, float]]:
    """A step's advantages with GEC's credit options, for both trainers and any estimator: the pre-correction batch
    (``prefix_advantage=before``), the step's estimator pass, the same estimator on the pre-correction batch (r0),
    then ``credit_edited_responses``.

    Args:
        data: the step's batch (rewards after correction).
        non_tensor_batch: where GEC's per-row fields are (flat columns, or v1's ``extra_fields``), in row order.
        gec: the run's ``GecConfig``.
        step_pass: the step's estimator pass on ``data`` (its metrics are the caller's).
        prepare_r0_pass: called before ``step_pass``, only when the r0 pass runs; returns that pass (it may keep
            state ``step_pass`` changes, e.g. a copy of GEPO's history).
        rows: (B,) bool, the real rows (v1 leaves verl's padding rows out); None: all.

    Returns:
        (``data`` with the credited advantages, the credit metrics: {} when the options change nothing).
    """
    before = pre_correction_batch(data, non_tensor_batch) if needs_pre_correction(gec) else None
    r0_pass = None if before is None else prepare_r0_pass()
    data = step_pass(data)
    adv_before = None if before is None else r0_pass(before).batch["advantages"]
    if not credit_active(gec):
        return data, {}
    return data, credit_edited_responses(data, non_tensor_batch, gec, adv_before, rows)
