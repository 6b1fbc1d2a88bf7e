"""``algorithm.edge_grpo.entropy_grad``: the actor loss that back-propagates through the response entropy.

verl 0.9.1 has one actor for both trainers, the engine worker (``verl.workers.engine_workers``), whose loss is a
callable ``loss(model_output, data, dp_group)`` set with ``set_loss_fn`` (verl sets the critic's the same way).
A registered policy loss would not do: it is never shown the entropy.  ``EntropyGradPPOLoss`` wraps verl's own
``ppo_loss``: it takes the per-token entropy of the forward pass (with gradients; verl computes it from the
temperature-scaled logits when ``calculate_entropy`` is set), forms each response's masked-mean H_i(θ),
multiplies the stored advantage Â_i(θ_old) by ``entropy_grad_multiplier`` and hands the result, gradients
attached, to ``ppo_loss``.  Everything else (clipping, loss aggregation over the global batch, KL, micro-batches,
data parallelism) stays verl's, so the loss is exact under any micro-batching and any number of ranks: H_i(θ)
is per response, H̄_g and H_i(old) come from the driver with each response.

Each micro-batch reports sums and counts; ``summarize_entropy_grad_metrics`` turns them into the step's
``edge_grpo/entropy_ratio_mean`` (mean of H_i(θ)/H_i(old) over the rescaled responses) and
``edge_grpo/entropy_grad_fallback_frac`` (share of them whose H_i(θ) was degenerate).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from verl_ext.algos.edge_grpo import entropy_grad_multiplier, response_entropy
from verl_ext.algos.registry import EDA_H_BAR_KEY, EDA_H_OLD_KEY

# per-micro-batch sums/counts the loss reports (verl prefixes them with "actor/")
_RAW = "edge_grpo/entropy_grad_raw/"
RATIO_SUM, RATIO_COUNT, RESCALED, FELL_BACK = (_RAW + k for k in ("ratio_sum", "ratio_count", "rescaled", "fell_back"))
RATIO_MEAN = "edge_grpo/entropy_ratio_mean"
FALLBACK_FRAC = "edge_grpo/entropy_grad_fallback_frac"


class EntropyGradPPOLoss:
    """verl's ``ppo_loss`` with Â_i(θ) = A_i·H̄_g/H_i(θ), H_i(θ) from this forward pass (picklable for Ray)."""

    def __init__(self, actor_config, entropy_eps: float = 1e-6, factor_min: float | None = None,
                 factor_max: float | None = None):
        self.actor_config = actor_config
        self.entropy_eps = entropy_eps
        self.factor_min = factor_min
        self.factor_max = factor_max

    def __call__(self, model_output, data, dp_group=None):
        # imported here, not at module level: the trainers import this module for the metric summary, with any loss
        from verl.workers.utils.losses import ppo_loss
        from verl.workers.utils.padding import no_padding_2_padding

        entropy = model_output.get("entropy", None)
        if entropy is None:
            raise RuntimeError("edge_grpo.entropy_grad: the actor's forward pass returned no entropy; "
                               "actor_rollout_ref.actor.calculate_entropy must be true during the update")
        token_entropy = no_padding_2_padding(entropy, data).float()  # (b, T), gradients attached
        fields = data.select("response_mask", "advantages", EDA_H_BAR_KEY, EDA_H_OLD_KEY).to_padded_tensor()
        mask = fields["response_mask"].bool()
        h_current = response_entropy(token_entropy, mask)
        h_old = fields[EDA_H_OLD_KEY].reshape(-1).float()
        multiplier, rescaled, fell_back = entropy_grad_multiplier(
            h_current, fields[EDA_H_BAR_KEY].reshape(-1).float(), h_old,
            self.entropy_eps, self.factor_min, self.factor_max,
        )
        advantages = fields["advantages"]
        data = data.clone(recurse=False)  # never write into the mini-batch: later epochs read it again
        data["advantages"] = advantages * multiplier.unsqueeze(-1).to(advantages.dtype)
        loss, metrics = ppo_loss(self.actor_config, model_output, data, dp_group)

        with torch.no_grad():
            measured = rescaled & torch.isfinite(h_current)
            ratio = torch.where(measured, h_current, 0.0) / torch.where(measured, h_old, 1.0)
            sums = [ratio.sum(), measured.sum(), rescaled.sum(), fell_back.sum()]
            counts = torch.stack([x.double() for x in sums]).tolist()  # one device sync, not four
        # plain floats: verl concatenates them over micro-batches and ranks
        metrics.update({key: float(value) for key, value in zip((RATIO_SUM, RATIO_COUNT, RESCALED, FELL_BACK), counts)})
        return loss, metrics


def metric_total(values) -> float:
    """Sum of a metric however verl nested it (list per micro-batch / rank / mini-batch, or already reduced)."""
    if isinstance(values, Iterable) and not isinstance(values, (str, bytes)):
        return float(sum(metric_total(v) for v in values))
    return float(np.asarray(values, dtype=np.float64))


def summarize_entropy_grad_metrics(metrics: dict, prefix: str = "actor/") -> dict:
    """Replace the loss's raw sums/counts in ``metrics`` (in place) by the step's ratio mean and fallback share.

    Every micro-batch reports every raw key, so sums of sums over counts are exact whether verl hands over the
    lists (legacy trainer) or their means (v1 trainer: the same number of entries under every key).
    """
    keys = [prefix + k for k in (RATIO_SUM, RATIO_COUNT, RESCALED, FELL_BACK)]
    if not all(k in metrics for k in keys):
        return metrics
    ratio_sum, ratio_count, rescaled, fell_back = (metric_total(metrics.pop(k)) for k in keys)
    metrics[RATIO_MEAN] = ratio_sum / ratio_count if ratio_count > 0 else 1.0
    metrics[FALLBACK_FRAC] = fell_back / rescaled if rescaled > 0 else 0.0
    return metrics


def entropy_grad_loss(config) -> EntropyGradPPOLoss:
    """The loss for a run's (resolved) config, built the way verl's worker builds its ``ppo_loss`` config."""
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.config import load_algorithm_config
    from verl_ext.verl_compat import check_actor_loss_fn

    check_actor_loss_fn()
    eda = load_algorithm_config(config.algorithm).edge_grpo
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    return EntropyGradPPOLoss(actor_config, eda.entropy_eps, eda.factor_min, eda.factor_max)
