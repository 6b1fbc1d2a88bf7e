"""GEPO — Group Entropy-Controlled Policy Optimization (arXiv 2607.16850), Eq. 4, 7, 8-9.

    H_g  = −Σ_i Σ_t log π(y_it) / Σ_i T_i                 (Eq. 4, "token_mean": sampled-token NLL pooled over the group)
    Ĥ_low = μ_H − β_low·σ_H,  Ĥ_high = μ_H + β_high·σ_H  (Eq. 8, μ/σ over the batch's groups, population std)
    H_*  ← (1 − γ)·H_* + γ·Ĥ_*                            (Eq. 9, GroupEntropyHistory; or Ĥ of a window)
    Â_i  = α_low·A_i   if A_i > 0 and H_g < H_low         (Eq. 7: damp positives in confident groups)
         = α_high·A_i  if A_i < 0 and H_g > H_high        (        damp negatives in exploring groups)
         = A_i         otherwise

Groups whose H_g is not finite (NaN log-probs, no response tokens) are left out of μ/σ, never shaped, and counted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from verl_ext.algos.groups import group_count, group_sum, masked_row_sum_and_count
from verl_ext.algos.history import GLOBAL_SCOPE, EntropyMoments, GroupEntropyHistory, ThresholdRule
from verl_ext.names import ENTROPY_ESTIMATORS


def group_entropy(
    estimator: str,
    response_mask: torch.Tensor,
    gid: torch.Tensor,
    num_groups: int,
    log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """H_g for each group, (G,). ``log_probs`` are the sampled tokens' log-probs, ``entropy`` full-vocab entropy."""
    source = entropy if estimator == "full_entropy" else log_probs
    if source is None:
        needs = "entropy" if estimator == "full_entropy" else "old_log_probs"
        raise ValueError(f"GEPO entropy_estimator={estimator!r} needs {needs}")
    resp_sum, resp_len = masked_row_sum_and_count(source.float(), response_mask)
    if estimator != "full_entropy":
        resp_sum = -resp_sum  # sampled-token NLL
    if estimator in ("token_mean", "full_entropy"):
        return group_sum(resp_sum, gid, num_groups) / group_sum(resp_len, gid, num_groups)
    if estimator == "sum_mean":  # Intern-S2 (Eq. 25): per-response sum, averaged over the K responses
        return group_sum(resp_sum, gid, num_groups) / group_count(gid, num_groups, resp_sum.dtype)
    if estimator == "resp_mean_of_means":
        return group_sum(resp_sum / resp_len, gid, num_groups) / group_count(gid, num_groups, resp_sum.dtype)
    raise ValueError(f"unknown GEPO entropy_estimator {estimator!r}; allowed: {ENTROPY_ESTIMATORS}")


def gepo_shape(
    adv: torch.Tensor, h_group: torch.Tensor, h_low: torch.Tensor, h_high: torch.Tensor, gid: torch.Tensor,
    alpha_low: float, alpha_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 7 on (B,) advantages given per-group H_g, H_low, H_high (G,). Returns (Â, damped_pos, damped_neg)."""
    h = h_group[gid]
    damp_pos = (adv > 0) & (h < h_low[gid])
    damp_neg = (adv < 0) & (h > h_high[gid])
    shaped = torch.where(damp_pos, alpha_low * adv, torch.where(damp_neg, alpha_high * adv, adv))
    return shaped, damp_pos, damp_neg


def gepo_advantage(
    adv: torch.Tensor,
    h_group: torch.Tensor,
    gid: torch.Tensor,
    group_scope: np.ndarray | None,
    history: GroupEntropyHistory,
    *,
    alpha_low: float = 0.5,
    alpha_high: float = 0.2,
    rule: ThresholdRule = ThresholdRule(),
    update_before_shaping: bool = True,
    stats_group_mask: torch.Tensor | None = None,
    with_stats: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Shape (B,) advantages by their group's entropy against each scope's thresholds; updates ``history``.

    ``group_scope`` (G,) names each group's scope (a data_source), or None: every group in the one global scope.
    ``rule`` says how batches become thresholds (β, γ, EMA or window, warm-up).  ``stats_group_mask`` (G,) picks
    the groups that enter μ/σ (default all; finite H_g is always required).  A scope that is not seeded yet
    (warming up) shapes nothing.  Returns (Â, stats); the threshold statistics are always reported, the
    attenuation shares only ``with_stats``.
    """
    finite = torch.isfinite(h_group)
    in_stats = finite if stats_group_mask is None else finite & stats_group_mask
    h_low = torch.full_like(h_group, -float("inf"))  # no thresholds yet -> nothing is shaped
    h_high = torch.full_like(h_group, float("inf"))
    if group_scope is None:
        scope_codes, scopes = None, [GLOBAL_SCOPE]
    else:
        codes, scopes = pd.factorize(np.asarray(group_scope, dtype=object))
        scope_codes, scopes = torch.from_numpy(codes.astype(np.int64, copy=False)), [str(x) for x in scopes]
    prefixes = {scope: "gepo" if scope == GLOBAL_SCOPE else f"gepo/{scope}" for scope in scopes}
    stats: dict[str, float] = {}
    pending = []  # (scope, moments) folded in after shaping when update_before_shaping is False
    for k, scope in enumerate(scopes):  # a handful of scopes at most, never one per group
        members = finite if scope_codes is None else (scope_codes == k) & finite
        chosen = in_stats if scope_codes is None else members & in_stats
        moments = None
        if chosen.any():
            moments = EntropyMoments.of(h_group[chosen])
            stats.update({f"{prefixes[scope]}/H_mean": moments.mean,
                          f"{prefixes[scope]}/H_std": moments.std(rule.std_unbiased)})
        if moments is not None and (update_before_shaping or history.thresholds(scope) is None):
            history.update(scope, moments, rule)  # also seeds the thresholds (first batch or end of warm-up)
        elif moments is not None:
            pending.append((scope, moments))
        current = history.thresholds(scope)
        if current is not None:
            h_low[members], h_high[members] = current
            stats.update({f"{prefixes[scope]}/H_low": current[0], f"{prefixes[scope]}/H_high": current[1]})
        else:
            stats[f"{prefixes[scope]}/warmup_batches"] = float(history.num_updates(scope))
    for scope, moments in pending:
        history.update(scope, moments, rule)

    shaped, damp_pos, damp_neg = gepo_shape(adv, h_group, h_low, h_high, gid, alpha_low, alpha_high)
    if with_stats:
        stats.update(_attenuation_fractions("gepo", adv, damp_pos, damp_neg))
        if scope_codes is not None:
            scope_of_response = scope_codes[gid]
            for k, scope in enumerate(scopes):
                rows = scope_of_response == k
                stats.update(_attenuation_fractions(prefixes[scope], adv[rows], damp_pos[rows], damp_neg[rows]))
        stats["gepo/nonfinite_group_entropy_count"] = float((~finite).sum().item())
    return shaped, stats


def _attenuation_fractions(prefix, adv, damp_pos, damp_neg) -> dict[str, float]:
    """Share of the positive (negative) advantages that were damped."""
    n_pos, n_neg = (adv > 0).sum().item(), (adv < 0).sum().item()
    return {
        f"{prefix}/frac_pos_attenuated": damp_pos.sum().item() / max(n_pos, 1),
        f"{prefix}/frac_neg_attenuated": damp_neg.sum().item() / max(n_neg, 1),
    }
