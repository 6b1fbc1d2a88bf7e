"""Credit for GEC's edited responses (docs/gec.md "Credit options"): which tokens of an edited response get which
advantage and which loss. torch only; the trainers' glue is ``verl_ext.trainer.gec_advantage``.

An edited response is P (the policy's own first attempt, kept before the edit) then the edit: the cue and the
policy's continuation (reflect), or the injected answer / reference solution and EOS. r0 / r1: its reward before /
after correction; Â(r) the run's advantage estimator on the group's rewards r (EDA's H̄_g/H_i and GEPO's shaping
included, per response as without the option).

    prefix_advantage   tokens of P                      tokens from the edit on
    after  (paper)     Â(r1)                            Â(r1)
    before             Â(r0)  (0 in an all-wrong group)  Â(r1)
    zero   (R³L)       0                                Â(r1)

    injected_loss      injected answer / solution / their EOS     every other token
    policy (paper)     verl's policy loss (clipped ratio, ratio 1 on the first pass)    verl's policy loss
    shaped (LUFFY)     -Â_t · f(π_θ(y_t)),  f(p) = p / (p + γ),  no clip, no old-probability denominator
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# kinds of a response span (verl_ext.rollout.gec.SPAN_KINDS) that LUFFY's shaped loss trains as off-policy tokens
OFF_POLICY_KINDS = ("answer", "solution", "eos")


def edit_masks(spans: Sequence, edited: Sequence[bool], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token masks of a batch's edited responses, from GEC's spans.

    Args:
        spans: per row, ``[kind, start, end]`` pieces of the final response (``gec_spans``; None: no GEC fields).
        edited: per row, whether GEC edited the response (its branch is an edit).
        width: the batch's response width T.

    Returns:
        (prefix, off_policy), (B, T) bool: the policy's own tokens before the edit (the leading ``policy`` span of
        an edited response), and the injected answer / solution tokens and the EOS after them.
    """
    prefix = torch.zeros(len(edited), width, dtype=torch.bool)
    off_policy = torch.zeros(len(edited), width, dtype=torch.bool)
    for i, (row, was_edited) in enumerate(zip(spans, edited)):
        if not was_edited or not row:
            continue
        kind, start, end = row[0]
        if kind == "policy":
            prefix[i, int(start):int(end)] = True
        for kind, start, end in row:
            if kind in OFF_POLICY_KINDS:
                off_policy[i, int(start):int(end)] = True
    return prefix, off_policy


def pre_correction_rewards(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           score_after: torch.Tensor, score_before: torch.Tensor) -> torch.Tensor:
    """The (B, T) token-level rewards with each response's outcome r1 replaced by r0 (at its last response token;
    any per-token term, e.g. a KL penalty in the reward, is kept). Rows where r0 == r1 are unchanged."""
    valid = response_mask.bool()
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, -1).max(dim=1).values.clamp(min=0)
    delta = (score_before - score_after).to(token_level_rewards.dtype)
    rewards = token_level_rewards.clone()
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += delta
    return rewards


def split_prefix_credit(adv_after: torch.Tensor, prefix: torch.Tensor, rule: str,
                        adv_before: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token advantages under ``prefix_advantage=rule`` (table above).

    Args:
        adv_after: (B, T) the estimator's advantages from the corrected rewards r1.
        prefix: (B, T) bool, the policy's own tokens before an edit (:func:`edit_masks`).
        rule: ``after`` | ``before`` | ``zero``.
        adv_before: (B, T) the same estimator's advantages from the pre-correction rewards r0 (``before`` only).

    Returns:
        (B, T) advantages: ``adv_after`` outside ``prefix``; inside it ``adv_after``, ``adv_before`` or 0.
    """
    if rule == "after":
        return adv_after
    if rule == "zero":
        return adv_after.masked_fill(prefix, 0.0)
    if rule == "before":
        if adv_before is None:
            raise ValueError("prefix_advantage=before needs the advantages of the pre-correction rewards")
        return torch.where(prefix, adv_before.to(adv_after.dtype), adv_after)
    raise ValueError(f"unknown prefix_advantage {rule!r}; allowed: after, before, zero")


def shaped_off_policy_loss(log_prob: torch.Tensor, advantages: torch.Tensor, gamma: float) -> torch.Tensor:
    """LUFFY's per-token off-policy loss -Â_t · f(π_θ(y_t)), f(p) = p / (p + γ) (arXiv 2504.14945, Eq. 6-7).

    Args:
        log_prob: (B, T) log π_θ(y_t) of the current forward pass, with gradients.
        advantages: (B, T) Â_t.
        gamma: γ > 0.

    Returns:
        (B, T) loss terms, to be masked and aggregated like the policy loss.
    """
    prob = log_prob.exp()
    return -advantages * prob / (prob + gamma)
