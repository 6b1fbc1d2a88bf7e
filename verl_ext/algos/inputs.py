"""Strict inputs at the estimator boundary: what a caller hands ``edge_grpo``/``gepo`` is checked before any math.

Called from verl's trainers, from user code or from a future verl, the registered estimators reject malformed input
with a ``ValueError`` that names the argument, never a torch-internal error or a silent result:

* every (B, T) tensor (``token_level_rewards``, ``response_mask``, ``entropy``, ``old_log_probs``,
  ``rollout_log_probs``; optional ones too, even when the chosen options do not read them) is a tensor of the same
  2-D shape;
* ``index`` and ``data_source`` have B entries;
* a non-finite reward is an error that says how many rows and which (a NaN reward is a reward-function bug, not a
  value to shape).

dtype and device mismatches are handled, not rejected: every tensor is brought to the rewards' device, the mask
may be bool/int/float, integer rewards give float advantages.  The checks cost O(B) beyond what the estimators
compute anyway (the reward check reads the per-row sums they need), so the fast path stays fast.
"""

from __future__ import annotations

import numpy as np
import torch

MAX_LISTED_ROWS = 10  # how many offending row numbers an error message lists


def _shape(x: torch.Tensor) -> str:
    return str(tuple(x.shape))


def check_batch_tensors(
    token_level_rewards, response_mask, **optional
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
    """Validate the (B, T) tensors; returns (rewards, mask, {name: tensor or None}) on the rewards' device.

    ``optional`` maps argument names (``entropy=...``, ``old_log_probs=...``) to a tensor or None.
    """
    if not isinstance(token_level_rewards, torch.Tensor):
        raise ValueError(f"token_level_rewards must be a (B, T) torch.Tensor, got {type(token_level_rewards).__name__}")
    if token_level_rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be 2-D (B, T), got shape {_shape(token_level_rewards)}")
    device, shape = token_level_rewards.device, token_level_rewards.shape
    checked = {}
    for name, value in (("response_mask", response_mask), *optional.items()):
        if value is None:
            if name == "response_mask":
                raise ValueError("response_mask is required: a (B, T) tensor like token_level_rewards")
            checked[name] = None
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape {_shape(token_level_rewards)} "
                             f"(like token_level_rewards), got {type(value).__name__}")
        if value.shape != shape:
            raise ValueError(f"{name} has shape {_shape(value)}, but token_level_rewards has "
                             f"{_shape(token_level_rewards)}; every (B, T) input must have the same shape")
        if value.dtype == torch.bool and name != "response_mask":
            raise ValueError(f"{name} must be a floating-point tensor, got dtype torch.bool")
        checked[name] = value if value.device == device else value.to(device)
    return token_level_rewards, checked.pop("response_mask"), checked


def check_row_labels(name: str, labels, batch_size: int) -> np.ndarray:
    """``labels`` (index / data_source: ndarray, list or tensor) as a flat array of ``batch_size`` entries."""
    if labels is None:
        raise ValueError(f"{name} is required: one label per response (B = {batch_size})")
    if isinstance(labels, torch.Tensor):
        flat = labels.detach().reshape(-1).cpu().numpy()
        ndim = labels.dim()
    else:
        array = np.asarray(labels, dtype=object) if not isinstance(labels, np.ndarray) else labels
        flat, ndim = array.reshape(-1), array.ndim
    if ndim != 1 or flat.size != batch_size:
        got = f"{flat.size} entries" if ndim == 1 else f"shape {tuple(np.shape(labels))}"
        raise ValueError(f"{name} must have one entry per response: B = {batch_size} (token_level_rewards' rows), "
                         f"got {got}")
    return flat


def check_finite_scores(scores: torch.Tensor) -> None:
    """Raise if any response's reward sum (B,) is NaN/inf, naming how many rows and which."""
    bad = ~torch.isfinite(scores)
    if not bool(bad.any()):
        return
    rows = bad.nonzero().squeeze(-1)
    listed = rows[:MAX_LISTED_ROWS].tolist()
    more = f" and {rows.numel() - len(listed)} more" if rows.numel() > len(listed) else ""
    raise ValueError(
        f"token_level_rewards: {rows.numel()} of {scores.numel()} rows have a non-finite reward (NaN/inf), rows "
        f"{listed}{more}; a NaN or infinite reward is a bug in the reward function, not a value to shape"
    )


def advantage_dtype(token_level_rewards: torch.Tensor) -> torch.dtype:
    """The advantages' dtype: the rewards' own when floating, float32 for integer rewards."""
    return token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
