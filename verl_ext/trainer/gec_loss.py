"""``algorithm.gec.injected_loss=shaped``: the actor loss that trains GEC's injected answer / solution tokens
off-policy, with LUFFY's policy shaping (arXiv 2504.14945; ``verl_ext.algos.gec_credit.shaped_off_policy_loss``).

Installed on verl's engine workers with ``set_loss_fn`` as ``eda_loss`` is (both trainers). ``ShapedInjectedPPOLoss``
calls verl's own ``ppo_loss`` with the advantages of the off-policy tokens set to 0 (so the clipped policy term,
and its ratio, leaves them out while they stay in its token count), then adds -Â_t·f(π_θ(y_t)) on those tokens,
aggregated by verl's ``agg_loss`` with the same mode and global-batch normalisation: verl's aggregations are linear
in the per-token loss for a fixed mask, so the sum is one loss whose token t is either PPO's or LUFFY's. KL,
entropy and everything else stay verl's. The mask comes from the driver with each response
(``verl_ext.trainer.gec_advantage.OFF_POLICY_MASK_KEY``).
"""

from __future__ import annotations

import torch

from verl_ext.algos.gec_credit import shaped_off_policy_loss
from verl_ext.config import LUFFY_SHAPING_GAMMA
from verl_ext.trainer.advantage import fit_width
from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY

SHAPED_PROB_SUM = "gec/credit/raw/off_policy_prob_sum"  # per micro-batch: Σ π_θ over the off-policy tokens
SHAPED_TOKENS = "gec/credit/raw/off_policy_tokens"
SHAPED_PROB_MEAN = "gec/credit/off_policy_prob_mean"


class ShapedInjectedPPOLoss:
    """verl's ``ppo_loss`` on the policy's tokens plus LUFFY's shaped term on injected ones (picklable for Ray)."""

    def __init__(self, actor_config, gamma: float = LUFFY_SHAPING_GAMMA):
        self.actor_config = actor_config
        self.gamma = float(gamma)

    def __call__(self, model_output, data, dp_group=None):
        from verl.trainer.ppo.core_algos import agg_loss
        from verl.workers.utils.losses import ppo_loss
        from verl.workers.utils.padding import no_padding_2_padding

        fields = data.select("response_mask", "advantages", OFF_POLICY_MASK_KEY).to_padded_tensor()
        mask = fields["response_mask"].bool()
        off_policy = fit_width(fields[OFF_POLICY_MASK_KEY].bool(), mask) & mask
        advantages = fields["advantages"]
        policy_part = data.clone(recurse=False)  # never write into the mini-batch: later epochs read it again
        policy_part["advantages"] = advantages.masked_fill(off_policy, 0.0)
        loss, metrics = ppo_loss(self.actor_config, model_output, policy_part, dp_group)

        log_prob = no_padding_2_padding(model_output["log_probs"], data)  # (b, T), gradients attached
        shaped = shaped_off_policy_loss(log_prob, advantages.to(log_prob.dtype), self.gamma)
        shaped = torch.where(off_policy, shaped, torch.zeros_like(shaped))
        # ppo_loss has just set the global-batch normalisation on the config it shares with agg_loss
        loss = loss + agg_loss(loss_mat=shaped, loss_mask=mask, loss_agg_mode=self.actor_config.loss_agg_mode,
                               **self.actor_config.global_batch_info)
        with torch.no_grad():
            sums = torch.stack([torch.where(off_policy, log_prob.exp(), 0.0).sum().double(),
                                off_policy.sum().double()]).tolist()
        metrics.update({SHAPED_PROB_SUM: float(sums[0]), SHAPED_TOKENS: float(sums[1])})
        return loss, metrics


def summarize_shaped_loss_metrics(metrics: dict, prefix: str = "actor/") -> dict:
    """Replace the loss's raw sums (in place) by the step's mean π_θ of its off-policy tokens."""
    from verl_ext.trainer.eda_loss import metric_total

    keys = (prefix + SHAPED_PROB_SUM, prefix + SHAPED_TOKENS)
    if not all(k in metrics for k in keys):
        return metrics
    prob_sum, tokens = (metric_total(metrics.pop(k)) for k in keys)
    if tokens > 0:
        metrics[SHAPED_PROB_MEAN] = prob_sum / tokens
    return metrics


def shaped_injected_loss(config) -> ShapedInjectedPPOLoss:
    """The loss for a run's (resolved) config, built the way verl's worker builds its ``ppo_loss`` config."""
    from verl.utils.config import omega_conf_to_dataclass

    from verl_ext.config import load_algorithm_config
    from verl_ext.verl_compat import check_actor_loss_fn

    check_actor_loss_fn()  # the same verl internals as the entropy_grad loss: set_loss_fn, ppo_loss, padding
    gec = load_algorithm_config(config.algorithm).gec
    return ShapedInjectedPPOLoss(omega_conf_to_dataclass(config.actor_rollout_ref.actor), gec.shaping_gamma)
