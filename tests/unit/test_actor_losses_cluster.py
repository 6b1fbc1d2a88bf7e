"""verl_ext's actor losses on the layouts a GPU cluster runs, on CPU: two gloo ranks, packed sequences
(``use_remove_padding=true``) and padded ones, token-count micro-batches (``use_dynamic_bsz=true`` with a
``ppo_max_token_len_per_gpu`` that re-packs the rows) and fixed ones, the legacy trainer's mini-batch (dense response
fields) and v1's (every verl field jagged, verl_ext's per-row fields and GEC's per-token mask dense), under all five
of verl 0.9.1's ``loss_agg_mode``s.

For each loss verl_ext installs (``edge_grpo.entropy_grad``, ``gec.injected_loss=shaped``, ``gec.mask_injected``: verl's
loss on a response mask with holes) and verl's vanilla loss as the control, the gradient verl's engine accumulates on
the two ranks equals autograd of the loss written out by hand (tests/unit/test_actor_losses.py) on the whole
mini-batch, and is far from the one of the same loss with its mask shifted by one token. One spawned two-rank group
runs every case (``_rank_main``); the tests read its results.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from functools import partial

import pytest
import torch

from tests.unit.test_actor_losses import (
    GRAD_RTOL,
    P,
    R,
    _batch,
    _engine_grads,
    _legacy_layout,
    _max_relative_error,
    _official_grads,
    _shaped_batch,
    _shaped_reference_grads,
    build_engine,
)
from verl_ext.algos.registry import EDA_H_BAR_KEY, EDA_H_OLD_KEY
from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY

RANKS = 2
LOSSES = ("vanilla", "entropy_grad", "shaped", "mask_injected")
# verl 0.9.1's core_algos.agg_loss: the five modes
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LAYOUTS = ("legacy", "v1")
MICRO_BATCH_SIZE = 4  # fixed micro-batches: two per rank
# token-count micro-batches: a rank's 8 rows hold 50-60 tokens (sequences of 3-9), so three micro-batches of rows
# regrouped by verl's balancing, not in their order (test_token_count_micro_batches_regroup_the_rows)
MAX_TOKEN_LEN = 24
GAMMA = 0.1
# a mask off by one token moves the gradient by far more than float noise (measured: docs/combinations.md)
SHIFTED_MIN_ERROR = 100 * GRAD_RTOL

CASES = [(loss, mode, layout, packed, dynamic) for loss in LOSSES for mode in MODES for layout in LAYOUTS
         for packed in (False, True) for dynamic in (False, True)]


def _case_id(loss, mode, layout, packed, dynamic) -> str:
    return f"{loss}-{mode}-{layout}-{'packed' if packed else 'padded'}-{'dynamic_bsz' if dynamic else 'fixed_bsz'}"


# ---- the mini-batch: two ranks' rows, in both trainers' layouts ---------------------------------------------------


# the outcome rewards of each rank's two groups of four (both signs in every group): verl_ext's estimators give the
# advantages of the vanilla and mask_injected cases
REWARDS = (1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0)


def _global_batch(reference, loss):
    """Every rank's rows (rank r: rows 8r..8r+7, its own tokens and lengths) with the loss's fields, and the GRPO
    advantages entropy_grad's hand-written loss starts from."""
    parts = [_batch(reference, seed) if loss == "entropy_grad" else (_shaped_batch(reference, seed), None)
             for seed in range(RANKS)]
    tensors = {k: torch.cat([t[k] for t, _ in parts]) for k in parts[0][0]}
    grpo_adv = torch.cat([a for _, a in parts]) if loss == "entropy_grad" else None
    if loss in ("vanilla", "mask_injected"):
        off = tensors.pop(OFF_POLICY_MASK_KEY)
        if loss == "mask_injected":  # GEC's injected tokens leave the response mask (verl_ext.rollout.gec)
            tensors["response_mask"] = _assembled_masks(tensors["responses"], tensors["response_mask"], off)
        tensors["advantages"] = _eda_advantages(reference, tensors)
        tensors["old_log_probs"] = tensors["old_log_probs"] * tensors["response_mask"]
    return tensors, grpo_adv


def _assembled_masks(responses, response_mask, off_policy):
    """The response masks ``assemble_response`` (``verl_ext.rollout.gec``, ``mask_injected=true``) gives responses
    made of policy pieces and the injected pieces ``off_policy`` marks, padded to the batch's width."""
    from verl_ext.rollout.gec import Segment, assemble_response

    masks = torch.zeros_like(response_mask)
    for row, (ids, valid, injected) in enumerate(zip(responses.tolist(), response_mask.tolist(), off_policy.tolist())):
        length = int(sum(valid))
        segments, start = [], 0
        for end in range(1, length + 1):  # one segment per run of policy or injected tokens
            if end == length or injected[end] != injected[start]:
                segments.append(Segment(ids=ids[start:end], injected=bool(injected[start])))
                start = end
        assembled = assemble_response(segments, response_length=R, mask_injected=True, with_logprobs=True)
        assert assembled.response_ids == ids[:length] and assembled.injected_tokens == int(sum(injected[:length]))
        masks[row, :length] = torch.tensor(assembled.response_mask, dtype=masks.dtype)
    return masks


def _eda_advantages(reference, tensors):
    """verl_ext's ``edge_grpo`` estimator (EDA, detached) on the rows' outcome rewards, groups of four and entropies of
    the reference policy over the response mask, as verl's trainer calls it."""
    import numpy as np
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from tests.unit.test_actor_losses import _policy

    mask = tensors["response_mask"]
    with torch.no_grad():
        _, entropy = _policy(reference, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    rows = len(mask)
    lengths = tensors["attention_mask"][:, P:].sum(-1)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(rows), lengths - 1] = torch.tensor(REWARDS * (rows // len(REWARDS)))
    index = np.array([f"g{row // 4}" for row in range(rows)], dtype=object)
    config = OmegaConf.create({"adv_estimator": "edge_grpo", "edge_grpo": {"entropy_grad": False}})
    advantages, _ = get_adv_estimator_fn("edge_grpo")(token_level_rewards=rewards, response_mask=mask, index=index,
                                                      config=config, entropy=entropy)
    assert (advantages * (1 - mask)).abs().max() == 0 and advantages.abs().max() > 0
    return advantages


def _rank_rows(tensors, rank):
    rows = len(tensors["input_ids"]) // RANKS
    return {k: v[rank * rows:(rank + 1) * rows] for k, v in tensors.items()}


def _v1_layout(tensors):
    """The mini-batch as verl's v1 trainer hands it to the actor from TransferQueue (``agent_loop_tq``): each row
    its own prompt and response, no padding, every verl field jagged (``loss_mask`` is the response mask);
    verl_ext's per-row fields dense, GEC's off-policy mask dense at the step's padded width (``verl_ext.trainer.v1``)."""
    from verl.utils import tensordict_utils as tu

    attention = tensors["attention_mask"].bool()
    prompt_valid, response_valid = attention[:, :P], attention[:, P:]
    rows = range(len(attention))

    def jagged(key, valid):
        return [tensors[key][i][valid[i]] for i in rows]

    prompts, responses = jagged("prompts", prompt_valid), jagged("responses", response_valid)
    input_ids = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    fields = {"prompts": prompts, "responses": responses, "input_ids": input_ids,
              "position_ids": [torch.arange(len(ids)) for ids in input_ids],
              **{k: jagged(k, response_valid) for k in ("response_mask", "old_log_probs", "advantages")}}
    data = {k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in fields.items()}
    data["loss_mask"] = data["response_mask"]
    data.update({k: tensors[k] for k in (EDA_H_BAR_KEY, EDA_H_OLD_KEY, OFF_POLICY_MASK_KEY) if k in tensors})
    return tu.get_tensordict(data)


# ---- the hand-written losses on the whole mini-batch --------------------------------------------------------------


def _reference_grads(reference, loss, tensors, grpo_adv, config):
    if loss == "entropy_grad":
        return _official_grads(reference, tensors, grpo_adv, config)
    if loss != "shaped":  # verl's clipped PPO on every token of the response mask
        tensors = {**tensors, OFF_POLICY_MASK_KEY: torch.zeros_like(tensors["response_mask"])}
    return _shaped_reference_grads(reference, tensors, config, GAMMA)


def _shifted_by_one_token(tensors):
    """The same mini-batch with the response mask (and GEC's off-policy mask) one token to the right."""
    shifted = dict(tensors)
    for key in ("response_mask", OFF_POLICY_MASK_KEY):
        if key in tensors:
            shifted[key] = torch.nn.functional.pad(tensors[key], (1, 0))[:, :-1]
    return shifted


def _loss_fn(loss, config):
    from verl.workers.utils.losses import ppo_loss

    from verl_ext.trainer.eda_loss import EntropyGradPPOLoss
    from verl_ext.trainer.gec_loss import ShapedInjectedPPOLoss

    if loss == "entropy_grad":
        return EntropyGradPPOLoss(config)
    if loss == "shaped":
        return ShapedInjectedPPOLoss(config, gamma=GAMMA)
    return partial(ppo_loss, config=config)


# ---- one two-rank group for every case ----------------------------------------------------------------------------


def _rank_main(rank, work, out_path):
    import faulthandler

    import torch.distributed as dist

    # a crash of the process (no Python exception) leaves its stack here, for the fixture's error message
    fault_log = open(os.path.join(work, f"rank{rank}.fault"), "w")  # noqa: SIM115 (open for the process's life)
    faulthandler.enable(fault_log)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS))
    torch.set_num_threads(1)
    # a file rendezvous: a free TCP port picked here could be taken by another test's server (Ray, vLLM on the other
    # pytest-xdist worker) before rank 0 binds it, and rank 1 would then talk to that server
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(work, 'rendezvous')}", rank=rank,
                            world_size=RANKS)
    try:
        engine, actor_config, reference = build_engine(use_remove_padding=True)
        results = {}
        for loss in LOSSES:
            tensors, grpo_adv = _global_batch(reference, loss)
            local = _rank_rows(tensors, rank)
            global_rows = len(tensors["input_ids"])
            for mode in MODES:
                # a constant horizon for seq-mean-token-sum-norm, as verl's actor.yaml asks for consistent
                # normalisation (its default is the width of the micro-batch's padded response tensor)
                config = dataclasses.replace(actor_config, loss_agg_mode=mode, loss_scale_factor=R)
                if rank == 0:
                    expected = _reference_grads(reference, loss, tensors, grpo_adv, config)
                    shifted = _reference_grads(reference, loss, _shifted_by_one_token(tensors), grpo_adv, config)
                for layout in LAYOUTS:
                    for packed in (False, True):
                        for dynamic in (False, True):
                            grads, _ = _engine_grads(engine, local, _loss_fn(loss, config), MICRO_BATCH_SIZE,
                                                     layout=_legacy_layout if layout == "legacy" else _v1_layout,
                                                     use_remove_padding=packed,
                                                     max_token_len=MAX_TOKEN_LEN if dynamic else None,
                                                     global_batch_size=global_rows)
                            if rank == 0:
                                results[_case_id(loss, mode, layout, packed, dynamic)] = {
                                    "error": _max_relative_error(grads, expected),
                                    "shifted_error": _max_relative_error(grads, shifted)}
        results.update(_default_horizon_cases(engine, actor_config, reference, rank))
        results["micro_batches"] = _token_count_micro_batches(_rank_rows(_global_batch(reference, "vanilla")[0], rank))
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _token_count_micro_batches(local):
    """The rows of each of verl's token-count micro-batches, per layout (both ranks call it: the count is synced)."""
    import torch.distributed as dist
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    partitions = {}
    for layout in LAYOUTS:
        data = (_legacy_layout if layout == "legacy" else _v1_layout)(local)
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=MAX_TOKEN_LEN)
        _, indices = prepare_micro_batches(data, dp_group=dist.group.WORLD, same_micro_num_in_dp=True)
        partitions[layout] = [[int(i) for i in rows] for rows in indices]
    return partitions


def _default_horizon_cases(engine, actor_config, reference, rank):
    """verl's own loss under ``seq-mean-token-sum-norm`` with ``loss_scale_factor=null`` (its default), fixed
    micro-batches, against the hand-written loss with the horizon verl's agg_loss reads (the width of the micro-batch's
    padded response tensor) and with the response length."""
    config = dataclasses.replace(actor_config, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=None)
    tensors, _ = _global_batch(reference, "vanilla")
    lengths = tensors["attention_mask"][:, P:].sum(-1).float()
    # each rank cuts its rows into consecutive micro-batches: the longest response of each
    longest_in_micro_batch = lengths.view(-1, 2).amax(-1).repeat_interleave(2)  # micro-batches of two rows
    horizons = {"legacy": float(R), "v1": longest_in_micro_batch}
    results = {}
    for layout in LAYOUTS:
        grads, _ = _engine_grads(engine, _rank_rows(tensors, rank), _loss_fn("vanilla", config), 2,
                                 layout=_legacy_layout if layout == "legacy" else _v1_layout,
                                 use_remove_padding=True, global_batch_size=len(lengths))
        if rank == 0:
            padded_width = _reference_grads(reference, "vanilla", tensors, None,
                                            dataclasses.replace(config, loss_scale_factor=horizons[layout]))
            response_length = _reference_grads(reference, "vanilla", tensors, None,
                                               dataclasses.replace(config, loss_scale_factor=R))
            results[f"default_horizon-{layout}"] = {"error": _max_relative_error(grads, padded_width),
                                                    "response_length_error": _max_relative_error(grads,
                                                                                                 response_length)}
    return results


# a rank killed by a signal (one CI run saw rank 1 die by SIGSEGV; no stack was kept) is respawned once, with its
# stack in a warning; an exception in a rank fails the tests at once
SPAWN_TRIES = 2


@pytest.fixture(scope="module")
def cluster_results(tmp_path_factory):
    for attempt in range(1, SPAWN_TRIES + 1):
        work = tmp_path_factory.mktemp("cluster")
        out_path = work / "results.json"
        try:
            torch.multiprocessing.spawn(_rank_main, args=(str(work), str(out_path)), nprocs=RANKS, join=True)
            break
        except torch.multiprocessing.ProcessExitedException as e:
            stacks = "\n".join(f"{p.name}:\n{p.read_text()}" for p in sorted(work.glob("rank*.fault")))
            message = f"the two-rank group failed ({e}); the ranks' fault handlers wrote:\n{stacks}"
            if e.signal_name is None or attempt == SPAWN_TRIES:
                raise RuntimeError(message) from e
            warnings.warn(message + "\nrespawning it once", stacklevel=1)
    with open(out_path) as f:
        return json.load(f)


@pytest.mark.parametrize(("loss", "mode", "layout", "packed", "dynamic"), CASES,
                         ids=[_case_id(*case) for case in CASES])
def test_engine_gradient_on_two_ranks_equals_the_hand_written_loss(cluster_results, loss, mode, layout, packed,
                                                                   dynamic):
    result = cluster_results[_case_id(loss, mode, layout, packed, dynamic)]
    assert result["error"] < GRAD_RTOL
    # and the comparison sees a mask one token off
    assert result["shifted_error"] > SHIFTED_MIN_ERROR


def test_verls_default_horizon_is_the_width_of_the_micro_batchs_padded_responses(cluster_results):
    """Not verl_ext's: where verl's Dr.GRPO normalisation comes from when ``loss_scale_factor`` is unset. The legacy
    layout keeps the batch's response width (a constant: the rollout pads to the response length); v1's jagged
    responses are padded per micro-batch, so each micro-batch is divided by its own longest response."""
    legacy, v1 = cluster_results["default_horizon-legacy"], cluster_results["default_horizon-v1"]
    assert legacy["error"] < GRAD_RTOL and legacy["response_length_error"] < GRAD_RTOL
    assert v1["error"] < GRAD_RTOL
    assert v1["response_length_error"] > 0.1  # not the response length's normalisation


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_count_micro_batches_regroup_the_rows(cluster_results, layout):
    """The dynamic-batch-size cases above run verl's re-packing: several micro-batches, rows out of their order."""
    partition = cluster_results["micro_batches"][layout]
    rows = [i for micro_batch in partition for i in micro_batch]
    assert len(partition) > 1 and sorted(rows) == list(range(8)) and rows != sorted(rows)


def test_the_mask_injected_case_trains_the_mask_gec_assembles():
    """The mask_injected case's response mask is ``assemble_response``'s: the response mask less the injected
    tokens, row by row (policy and injected pieces alternating, one row all policy)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    off = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    responses = torch.arange(20).view(4, 5)
    assert torch.equal(_assembled_masks(responses, mask, off), mask * (1 - off))
