"""One function for both trainers: a verl batch -> estimator arguments -> advantages + metrics.

Data flows one way: the trainer hands a DataProto (token_level_rewards, response_mask, old_log_probs, the
old-log-prob pass's per-token ``entropy``, uid and data_source); this module turns it into the keyword arguments
of the registered estimator, calls it through verl's registry, writes ``advantages``/``returns`` back and returns
the step's metrics.
"""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from verl_ext.algos.groups import group_ids, group_mean_std, masked_row_mean
from verl_ext.algos.history import GroupEntropyHistory
from verl_ext.names import ADV_ESTIMATORS

# per-token entropy of the old-log-prob pass: v1's TransferQueue field name, and the key under which the legacy
# trainer keeps a copy (verl's legacy fit() pops its own "entropys" before computing advantages)
ENTROPY_KEY = "entropy"


def is_extension_estimator(adv_estimator) -> bool:
    return str(getattr(adv_estimator, "value", adv_estimator)) in ADV_ESTIMATORS


def estimator_kwargs(data: DataProto, config, history: GroupEntropyHistory | None) -> dict:
    """The keyword arguments of verl_ext's estimators, read from a batch (optional inputs only when present)."""
    kwargs = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": data.batch["response_mask"],
        "index": data.non_tensor_batch["uid"],
        "config": config,
        "entropy_history": history,
    }
    for key, name in ((ENTROPY_KEY, "entropy"), ("old_log_probs", "old_log_probs"),
                      ("rollout_log_probs", "rollout_log_probs")):
        if key in data.batch.keys():
            kwargs[name] = data.batch[key]
    if "data_source" in data.non_tensor_batch:
        kwargs["data_source"] = data.non_tensor_batch["data_source"]
    return kwargs


def batch_diagnostics(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, advantages: torch.Tensor,
                      entropy: torch.Tensor | None = None) -> dict[str, float]:
    """Collapse, advantage variance and response entropy of one step (for any adv_estimator, verl's included)."""
    mask = response_mask
    scores = token_level_rewards.sum(-1).float()
    gid, num_groups = group_ids(index)
    _, reward_std, count = group_mean_std(scores, gid, num_groups)
    multi = count > 1
    per_response_adv, _ = masked_row_mean(advantages.float(), mask)
    per_response_adv = torch.nan_to_num(per_response_adv, nan=0.0)  # empty responses carry no advantage
    metrics = {
        "verl_ext/collapsed_group_frac": ((reward_std == 0) & multi).sum().item() / max(multi.sum().item(), 1),
        "verl_ext/singleton_group_count": float((~multi).sum().item()),
        "verl_ext/adv_var": per_response_adv.var().item() if per_response_adv.numel() > 1 else 0.0,
        "verl_ext/empty_response_count": float((mask.sum(-1) == 0).sum().item()),
    }
    if entropy is not None:
        h_resp, _ = masked_row_mean(entropy.float(), mask)
        h_resp = h_resp[torch.isfinite(h_resp)]
        if h_resp.numel():
            metrics["verl_ext/response_entropy_mean"] = h_resp.mean().item()
            metrics["verl_ext/response_entropy_std"] = h_resp.std(unbiased=False).item()
    return metrics


def verl_step_diagnostics(data: DataProto, entropy: torch.Tensor | None,
                          rows: np.ndarray | None = None) -> dict[str, float]:
    """The same step diagnostics for a batch whose advantages verl computed itself (grpo, gae, ...).

    ``rows`` (B,) bool: the rows to describe (verl's padding rows left out); None: all.
    """
    inputs = {"token_level_rewards": data.batch["token_level_rewards"], "response_mask": data.batch["response_mask"],
              "index": data.non_tensor_batch["uid"], "advantages": data.batch["advantages"], "entropy": entropy}
    inputs = select_rows(inputs, rows)
    return batch_diagnostics(inputs["token_level_rewards"], inputs["response_mask"], inputs["index"],
                             inputs["advantages"], inputs["entropy"])


def select_rows(values: dict, rows: np.ndarray | None) -> dict:
    """``values`` (name -> (B, ...) tensor, (B,) array or anything else, passed as is) restricted to ``rows``."""
    if rows is None or bool(np.all(rows)):
        return values
    rows = np.asarray(rows, dtype=bool)
    picked = torch.from_numpy(np.nonzero(rows)[0])
    out = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows.shape[0]:
            value = value[picked.to(value.device)]
        elif isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == rows.shape[0]:
            value = value[rows]
        out[name] = value
    return out


def scatter_rows(values: torch.Tensor, rows: np.ndarray | None, num_rows: int) -> torch.Tensor:
    """A (B', ...) result of the ``rows`` subset back in the (B, ...) batch, zero in the other rows."""
    if rows is None or values.shape[0] == num_rows:
        return values
    full = values.new_zeros((num_rows, *values.shape[1:]))
    full[torch.from_numpy(np.nonzero(np.asarray(rows, dtype=bool))[0]).to(values.device)] = values
    return full


def compute_extension_advantage(
    data: DataProto, adv_estimator: str, config, history: GroupEntropyHistory | None,
    rows: np.ndarray | None = None,
) -> tuple[DataProto, dict[str, float]]:
    """Run a verl_ext estimator on ``data`` in place; returns (data, metrics).

    ``rows`` (B,) bool: the rows the estimator sees (v1 leaves verl's padding rows out, so they enter no statistic,
    metric or history); the other rows get advantage, return and loss fields 0.  None: every row.
    """
    kwargs = select_rows(estimator_kwargs(data, config, history), rows)
    metrics: dict[str, float] = {}
    loss_inputs: dict[str, torch.Tensor] = {}  # per-response fields for the actor loss (edge_grpo.entropy_grad)
    advantages, returns = get_adv_estimator_fn(adv_estimator)(**kwargs, metrics=metrics, loss_inputs=loss_inputs)
    num_rows = len(data)
    data.batch["advantages"] = scatter_rows(advantages, rows, num_rows)
    data.batch["returns"] = scatter_rows(returns, rows, num_rows)
    data.batch.update({k: scatter_rows(v, rows, num_rows) for k, v in loss_inputs.items()})
    metrics.update(batch_diagnostics(kwargs["token_level_rewards"], kwargs["response_mask"], kwargs["index"],
                                     advantages, kwargs.get("entropy")))
    return data, metrics


def fit_width(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Right-pad or cut a separately padded (B, T') per-token field to the (B, T) layout of ``like`` (responses start
    at position 0: v1 keeps fields at the step's padded width, a micro-batch pads to its own longest response)."""
    width = like.shape[-1]
    values = values[..., :width]
    if values.shape[-1] < width:
        values = torch.nn.functional.pad(values, (0, width - values.shape[-1]))
    return values.to(like.device)


def as_object_array(values) -> np.ndarray:
    """A non-tensor column fetched from TransferQueue (list, NonTensorStack, ndarray) as verl's object array."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    return np.array(list(values), dtype=object)


def final_outputs(batch_keys) -> tuple[list[int], list[int]]:
    """verl's rule for agent loops that return several outputs per sample (v1's
    ``compute_advantage_for_multi_trajectories``, for GRPO): of the rows keyed ``{uid}_{session}_{output}``, only the
    highest ``output`` of each ``{uid}_{session}`` is a member of its group (a key of another form: its own session).

    Returns (the rows of those last outputs, in first-appearance order of their sessions; per row, the position of
    its session's last output in that list).
    """
    last: dict[str, tuple[int, int]] = {}
    sessions = []
    for i, key in enumerate(batch_keys):
        session, _, output = str(key).rpartition("_")
        if "_" not in session or not output.isdigit():
            session, output = f"{key}\0{i}", "0"
        sessions.append(session)
        if session not in last or last[session][0] < int(output):
            last[session] = (int(output), i)
    position = {session: p for p, session in enumerate(last)}
    return [row for _, row in last.values()], [position[s] for s in sessions]


def _first_token_value(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) the value at each row's first response token (verl's per-response scalar of a token-level tensor)."""
    first = mask.argmax(dim=1)
    return values[torch.arange(values.shape[0], device=values.device), first]


def on_final_outputs(data: DataProto, batch_keys, rows: np.ndarray | None, compute) -> DataProto:
    """``compute(data, rows)`` on the last output of each session only (``final_outputs``), as verl's GRPO does.

    The other outputs of a session get its last output's advantage and return on each of their response tokens
    (verl's copy-back) and 0 in the per-response loss fields ``compute`` adds (an ``entropy_grad`` H_i(old) of 0
    keeps that advantage as it is).
    """
    finals, owner = final_outputs(batch_keys)
    if finals == list(range(len(data))):  # one output per session
        return compute(data, rows)
    picked = None if rows is None else np.asarray(rows, dtype=bool)[finals]
    final = compute(data.select_idxs(finals), picked)
    added = set(final.batch.keys()) - set(data.batch.keys()) - {"advantages", "returns"}
    mask = data.batch["response_mask"]
    owner_t = torch.tensor(owner, device=mask.device)
    for name in ("advantages", "returns"):
        value = _first_token_value(final.batch[name], final.batch["response_mask"])
        data.batch[name] = value[owner_t].unsqueeze(-1) * mask.to(value.dtype)
    for name in added:
        value = final.batch[name]
        full = value.new_zeros((len(data), *value.shape[1:]))
        full[torch.tensor(finals, device=value.device)] = value
        data.batch[name] = full
    return data
