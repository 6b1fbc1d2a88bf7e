"""verl's rollout-vs-actor diagnostics over the tokens a rollout engine sampled, and the share GEC injected.

A response GEC corrected is made of pieces the engine sampled (the policy's first response, its continuation after
the cue: real rollout log-probs) and pieces GEC injected (the cue, the answer template, the reference solution, an
added EOS: rollout log-prob 0.0, nobody sampled them); the ``gec_agent`` loop records where each lies
(``verl_ext.rollout.gec.KEY_SPANS``). With ``mask_injected=false`` (the paper's setting) the injected tokens stay in
``response_mask``, and verl's two comparisons of rollout and actor log-probs would read them as tokens sampled with
probability 1 (the toy demo: ``training/rollout_probs_diff_max`` 1.0, ``rollout_corr/kl`` 0.33 at step 1, where
the rollout's log-probs equal the actor's on every sampled token):

* ``calculate_debug_metrics`` (``verl/utils/debug/metrics.py``): ``training/rollout_probs_diff_*`` and
  ``training/rollout_actor_probs_pearson_corr``, after the old-log-prob pass;
* ``compute_offpolicy_metrics`` (``verl/trainer/ppo/rollout_corr_helper.py``): ``rollout_corr/kl``, ``k3_kl``, the
  perplexities, ``chi2_*``, inside verl's rollout correction before the advantages.

The functions here run verl's own two functions on the response mask less the injected tokens, so they report what
verl reports for the same batch with ``mask_injected=true``. That mask reaches these metrics only: ``response_mask``,
``old_log_probs``, ``rollout_log_probs`` and the advantages stay as verl and the engine made them. The trainers
(``mixin.py``) hand verl's calls these versions while GEC is on with ``mask_injected=false``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from verl import DataProto

from verl_ext.rollout.gec import KEY_SPANS, injected_token_mask
from verl_ext.trainer.gec_metrics import gec_columns


def sampled_token_mask(response_mask: torch.Tensor, spans_rows: Sequence) -> torch.Tensor:
    """``response_mask`` (B, T) with the tokens GEC injected set to 0 (same dtype and device).

    Args:
        response_mask: the batch's response mask.
        spans_rows: per row, GEC's ``[kind, start, end]`` pieces of the final response (None: not a GEC row).
    """
    if len(spans_rows) != response_mask.shape[0]:
        raise ValueError(f"GEC's spans of {len(spans_rows)} rows for a response mask of {response_mask.shape[0]}")
    injected = torch.from_numpy(injected_token_mask(spans_rows, tuple(response_mask.shape)))
    return response_mask.masked_fill(injected.to(response_mask.device), 0)


def injected_token_frac(response_mask: torch.Tensor, spans_rows: Sequence) -> float:
    """Share of the trained tokens (``response_mask`` 1) that GEC injected; 0.0 when no token is trained."""
    trained = response_mask.bool()
    injected = trained & ~sampled_token_mask(response_mask, spans_rows).bool()
    count = int(trained.sum())
    return float(injected.sum()) / count if count else 0.0


def debug_metrics_on_sampled_tokens(calculate_debug_metrics: Callable[[DataProto], dict], data: DataProto,
                                    spans_rows: Sequence) -> dict:
    """verl's ``calculate_debug_metrics`` on ``data`` with its response mask less GEC's injected tokens (``data``
    itself is left as it is).

    Args:
        calculate_debug_metrics: verl's function.
        data: the batch verl passes it (``rollout_log_probs``, ``old_log_probs``, ``responses``, ``response_mask``
            or else ``attention_mask``, from which verl takes the response part).
        spans_rows: per row of ``data``, GEC's pieces.
    """
    width = data.batch["responses"].size(1)
    mask = data.batch["response_mask"] if "response_mask" in data.batch.keys() else (
        data.batch["attention_mask"][:, -width:])
    view = data.batch.clone(recurse=False)  # the same tensors, one key replaced
    view["response_mask"] = sampled_token_mask(mask, spans_rows)
    return calculate_debug_metrics(DataProto(batch=view, non_tensor_batch=data.non_tensor_batch,
                                             meta_info=data.meta_info))


def offpolicy_metrics_on_sampled_tokens(compute_offpolicy_metrics: Callable[..., dict], spans_rows: Sequence,
                                        old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None,
                                        response_mask: torch.Tensor) -> dict:
    """verl's ``compute_offpolicy_metrics`` on ``response_mask`` less GEC's injected tokens; {} when no sampled token
    is left (a step of reference solutions only: verl's function requires one).

    Args:
        compute_offpolicy_metrics: verl's function (keyword arguments as verl's rollout correction calls it).
        spans_rows: per row, GEC's pieces.
        old_log_prob, rollout_log_prob, response_mask: (B, T), as verl passes them.
    """
    sampled = sampled_token_mask(response_mask, spans_rows)
    if not sampled.bool().any():
        return {}
    return compute_offpolicy_metrics(old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob,
                                     response_mask=sampled)


def spans_of_rows(non_tensor_batch: dict, n: int) -> list:
    """Per row, GEC's ``[kind, start, end]`` pieces from the batch's non-tensor columns (flat ``gec_spans``: legacy;
    ``extra_fields``: v1); None for a row without them."""
    columns = gec_columns(non_tensor_batch, n, keys=(KEY_SPANS,))
    return [None] * n if columns is None else list(columns[KEY_SPANS])
