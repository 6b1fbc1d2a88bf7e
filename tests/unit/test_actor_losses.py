"""verl_ext's actor losses in verl's real engine: ``algorithm.edge_grpo.entropy_grad`` (the official EDGE-GRPO
gradient through 1/H_i(θ)) and ``algorithm.gec.injected_loss=shaped`` (LUFFY's policy shaping on GEC's injected
tokens).

The pure parts (the driver's split, the loss's multiplier, the metrics) are checked directly; each loss itself runs
inside verl's real FSDP2 engine (one CPU rank, the toy Qwen2) and its gradient is compared with autograd of the
loss written out by hand: entropy_grad -min(r·Â, clip(r)·Â) with Â_i = A_i·H̄_g/H_i(θ), H_i(θ) the masked mean of
the full-vocabulary entropy of the temperature-scaled logits, computed with gradients; shaped -Â_t·π_θ/(π_θ+γ) on
the injected tokens, verl's clipped PPO term on the others.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import socket
from functools import partial

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext.algos.edge_grpo import (
    edge_grpo_advantage,
    entropy_grad_multiplier,
    entropy_grad_split,
    response_entropy,
)
from verl_ext.algos.registry import EDA_H_BAR_KEY, EDA_H_OLD_KEY
from verl_ext.config import ConfigError, EdgeGrpoConfig, load_algorithm_config
from verl_ext.run_checks import validate_entropy_grad
from verl_ext.trainer.eda_loss import (
    FALLBACK_FRAC,
    RATIO_MEAN,
    EntropyGradPPOLoss,
    summarize_entropy_grad_metrics,
)
from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY
from verl_ext.trainer.gec_loss import SHAPED_PROB_MEAN, ShapedInjectedPPOLoss, summarize_shaped_loss_metrics

edge = get_adv_estimator_fn("edge_grpo")
ON = {"edge_grpo": {"entropy_grad": True}}


# ---- driver side -------------------------------------------------------------------------------------------------


def test_split_keeps_todays_advantage_and_marks_unscaled_responses():
    torch.manual_seed(0)
    gid = torch.tensor([0, 0, 0, 1, 1, 2])  # group 2 has one member: EDA leaves it unscaled
    adv = torch.randn(6)
    mask = torch.ones(6, 3)
    entropy = torch.rand(6, 3) + 0.1
    entropy[1] = 0.0  # degenerate: unscaled and counted
    scaled, h_bar, h_old, stats = entropy_grad_split(adv, entropy, mask, gid, 3)
    today, today_stats = edge_grpo_advantage(adv, entropy, mask, gid, 3)
    assert torch.equal(scaled, today) and stats == today_stats
    usable = torch.tensor([True, False, True, True, True, False])
    assert torch.equal(h_old > 0, usable) and torch.equal(h_bar > 0, usable)
    h = entropy.mean(-1)
    torch.testing.assert_close(h_old[usable], h[usable])
    torch.testing.assert_close(h_bar[0], (h[0] + h[2]) / 2)  # the group mean over its valid members
    torch.testing.assert_close(scaled[usable], (adv * h_bar / h_old)[usable])


def test_estimator_with_entropy_grad_hands_the_loss_its_fields():
    R, M = outcome_batch([1.0, 0.0, 1.0, 0.0], [2, 1, 2, 2])
    E = torch.tensor([[0.2, 0.4], [0.6, 9.0], [0.5, 0.5], [0.1, 0.3]])
    today, _ = edge(token_level_rewards=R, response_mask=M, index=uids(4), config={}, entropy=E)
    fields: dict = {}
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(4), config=ON, entropy=E, loss_inputs=fields)
    assert torch.equal(adv, today)  # the stored advantage is Â at θ_old in both modes
    torch.testing.assert_close(fields[EDA_H_OLD_KEY], torch.tensor([0.3, 0.6, 0.5, 0.2]))
    torch.testing.assert_close(fields[EDA_H_BAR_KEY], torch.full((4,), 0.4))
    off: dict = {}
    edge(token_level_rewards=R, response_mask=M, index=uids(4), config={}, entropy=E, loss_inputs=off)
    assert off == {}  # entropy_grad=false: nothing for the loss, verl's own loss runs unchanged
    with pytest.raises(ValueError, match="entropy_grad=true needs loss_inputs"):
        edge(token_level_rewards=R, response_mask=M, index=uids(4), config=ON, entropy=E)


# ---- the loss's multiplier ---------------------------------------------------------------------------------------


def test_multiplier_turns_the_stored_advantage_into_the_official_one_with_its_gradient():
    a = torch.tensor([1.5, -0.7, 0.4])
    h_bar = torch.tensor([0.8, 0.8, 0.5])
    h_old = torch.tensor([0.6, 1.1, 0.45])
    stored = a * h_bar / h_old
    h_now = torch.tensor([0.7, 0.9, 0.5], requires_grad=True)
    mult, rescaled, fell_back = entropy_grad_multiplier(h_now, h_bar, h_old)
    (stored * mult).sum().backward()
    ours = h_now.grad.clone()
    h_ref = h_now.detach().clone().requires_grad_(True)
    official = a * h_bar / h_ref
    official.sum().backward()
    torch.testing.assert_close((stored * mult).detach(), official.detach())
    torch.testing.assert_close(ours, h_ref.grad)  # = -A·H̄/H²: the advantage-weighted entropy term
    assert rescaled.all() and not fell_back.any()


def test_multiplier_with_the_factor_clamp():
    h_bar, h_old = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 1.0])
    h_now = torch.tensor([0.2, 0.8], requires_grad=True)
    mult, _, _ = entropy_grad_multiplier(h_now, h_bar, h_old, factor_min=0.5, factor_max=3.0)
    old = torch.tensor([2.0, 1.0])  # detached factors, inside [0.5, 3]
    torch.testing.assert_close(mult.detach(), torch.tensor([3.0, 1.25]) / old)  # 1/0.2 = 5 is clamped to 3
    mult.sum().backward()
    assert h_now.grad[0] == 0 and h_now.grad[1] != 0  # a clamped factor carries no entropy gradient


@pytest.mark.parametrize("bad", [0.0, 1e-9, float("nan"), float("inf")])
def test_degenerate_current_entropy_falls_back_to_the_detached_factor(bad):
    token_entropy = torch.tensor([[0.5, 0.7, 0.0], [bad, bad, 0.0], [0.3, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    h_now = response_entropy(token_entropy, mask)
    h_old = torch.tensor([0.5, 0.4, 0.0])  # the third response (empty) was not rescaled by EDA
    mult, rescaled, fell_back = entropy_grad_multiplier(h_now, torch.full((3,), 0.45), h_old)
    assert mult[1] == 1.0 and mult[2] == 1.0  # exactly the stored (detached) advantage
    assert fell_back.tolist() == [False, True, False] and rescaled.tolist() == [True, True, False]
    (mult * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.isfinite(token_entropy.grad).all()  # never a NaN gradient from the fallback rows
    assert token_entropy.grad[1:].abs().sum() == 0 and token_entropy.grad[0, :2].abs().sum() > 0


def test_metrics_are_exact_sums_over_micro_batches_for_both_trainers():
    raw = {"actor/edge_grpo/entropy_grad_raw/ratio_sum": [[1.8, 3.0], [2.1, 0.9]],
           "actor/edge_grpo/entropy_grad_raw/ratio_count": [[2.0, 3.0], [2.0, 1.0]],
           "actor/edge_grpo/entropy_grad_raw/rescaled": [[2.0, 4.0], [2.0, 2.0]],
           "actor/edge_grpo/entropy_grad_raw/fell_back": [[0.0, 1.0], [0.0, 1.0]],
           "actor/pg_loss": 0.1}
    legacy = summarize_entropy_grad_metrics(copy.deepcopy(raw))  # the legacy trainer hands over the lists
    v1 = summarize_entropy_grad_metrics({k: float(np.mean(v)) for k, v in raw.items()})  # v1: their means
    for metrics in (legacy, v1):
        assert metrics[RATIO_MEAN] == pytest.approx(7.8 / 8)
        assert metrics[FALLBACK_FRAC] == pytest.approx(2 / 10)
        assert not any("entropy_grad_raw" in k for k in metrics) and "actor/pg_loss" in metrics


# ---- configuration and installation ------------------------------------------------------------------------------


def _run_config(estimator="edge_grpo", entropy_grad=True, **extra):
    from omegaconf import OmegaConf

    return OmegaConf.create({"algorithm": {"adv_estimator": estimator, "edge_grpo": {"entropy_grad": entropy_grad}},
                             "actor_rollout_ref": {"actor": {"calculate_entropy": False}}, **extra})


def test_start_up_validation():
    assert load_algorithm_config(None).edge_grpo.entropy_grad is False  # default: the detached rescaling
    validate_entropy_grad(_run_config())
    validate_entropy_grad(_run_config("gepo", entropy_grad=False))
    with pytest.raises(ConfigError, match=r"algorithm\.edge_grpo\.entropy_grad.*adv_estimator=edge_grpo only"):
        validate_entropy_grad(_run_config("gepo"))
    with pytest.raises(ConfigError, match=r"algorithm\.edge_grpo\.entropy_grad.*distillation"):
        validate_entropy_grad(_run_config(distillation={"enabled": True}))
    with pytest.raises(ConfigError, match=r"algorithm\.edge_grpo\.entropy_grad='yes'"):
        EdgeGrpoConfig(entropy_grad="yes").validate()


class _FakeWorkerGroup:
    def __init__(self):
        self.loss_fns = []

    def set_loss_fn(self, loss_fn):
        self.loss_fns.append(loss_fn)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_trainer_installs_the_loss_only_when_asked(monkeypatch, entropy_grad):
    from verl_ext.trainer.mixin import ExtTrainerMixin

    trainer = ExtTrainerMixin()
    trainer.config = _run_config(entropy_grad=entropy_grad)
    trainer.actor_rollout_wg = _FakeWorkerGroup()
    # the real ActorConfig needs verl's full actor node; the engine tests below use the real one
    monkeypatch.setattr("verl.utils.config.omega_conf_to_dataclass", lambda node: {"built_from": dict(node)})
    trainer._ext_install_entropy_grad_loss()
    if not entropy_grad:  # today's run: verl's own actor loss, verl's own entropy setting
        assert trainer.actor_rollout_wg.loss_fns == []
        assert trainer.config.actor_rollout_ref.actor.calculate_entropy is False
        return
    (loss,) = trainer.actor_rollout_wg.loss_fns
    assert isinstance(loss, EntropyGradPPOLoss) and loss.entropy_eps == EdgeGrpoConfig().entropy_eps
    assert trainer.config.actor_rollout_ref.actor.calculate_entropy is True
    assert isinstance(pickle.loads(pickle.dumps(loss)), EntropyGradPPOLoss)  # Ray ships it to the workers


# ---- the loss inside verl's FSDP engine: gradient against the hand-written official loss -------------------------

B, P, R = 8, 4, 5  # two groups of four; left-padded prompts, right-padded responses
# The toy model is confident on the random batches below: at 0.7 some responses' mean entropy falls to 1e-4, where the
# 1/H_i(θ) factor turns fp32 cancellation in the entropy into percent-level gradient differences between two correct
# computations. At 1.5 every response's entropy is above 0.1 on the batches the tests use (checked in _batch).
TEMPERATURE = 1.5
MIN_RESPONSE_ENTROPY = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_engine(use_remove_padding: bool = False):
    """verl's FSDP2 actor engine with the toy Qwen2, built as verl's worker builds it, in the current process group,
    and the same weights as a plain HF model (the reference). ``use_remove_padding`` is the model setting verl's GPU
    default turns on; each batch still picks its path with its own ``use_remove_padding`` entry."""
    import transformers
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine import EngineRegistry

    import verl_ext.main  # noqa: F401  (the ${verl_ext_toy:...} resolver and the structured configs)
    from tests.unit.test_config import CONFIG_DIR

    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="toy_cpu", overrides=[f"actor_rollout_ref.model.use_remove_padding={use_remove_padding}"])
    OmegaConf.resolve(cfg)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    engine_config = actor_config.engine
    engine_config.use_dynamic_bsz = False
    engine_config.use_remove_padding = False
    engine = EngineRegistry.new(model_type="language_model", backend=engine_config.strategy,
                                model_config=model_config, engine_config=engine_config,
                                optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint)
    engine.initialize()
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_config.local_path, dtype=torch.float32,
                                                                  attn_implementation="sdpa")
    return engine, actor_config, reference


@pytest.fixture(scope="module")
def engine_setup():
    """The engine on one CPU rank (gloo)."""
    import torch.distributed as dist

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield build_engine()
    if own_group:
        dist.destroy_process_group()


def _batch(reference, seed=0):
    """A batch as verl's legacy trainer hands it to the actor, with the driver's entropy_grad fields (another seed:
    other tokens and response lengths, the same two groups of four)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.tensor([4, 3, 4, 2, 4, 4, 3, 4])
    resp_len = torch.tensor([5, 2, 4, 5, 1, 3, 5, 4]) if seed == 0 else torch.randint(1, R + 1, (B,), generator=g)
    ids = torch.randint(3, 250, (B, P + R), generator=g)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    for i in range(B):
        attention[i, P - prompt_len[i]: P + resp_len[i]] = 1
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    mask = attention[:, P:].float()
    with torch.no_grad():
        log_probs, entropy = _policy(reference, ids, attention, position)
    h_now = (entropy * mask).sum(-1) / mask.sum(-1)
    assert h_now.min() > MIN_RESPONSE_ENTROPY, f"ill-conditioned test batch (raise TEMPERATURE): entropies {h_now}"
    grpo_adv = torch.tensor([1.2, -0.4, 0.0, -0.8, 0.9, -0.9, 0.5, -0.5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    old_entropy = entropy * (1 + 0.3 * torch.rand(B, 1, generator=g))  # H(old) != H(θ): it must cancel out
    adv, h_bar, h_old, _ = entropy_grad_split(grpo_adv, old_entropy, mask, gid, 2)
    old_log_probs = log_probs + 0.3 * torch.randn(B, R, generator=g)  # ratios on both sides of the clip
    tensors = {"input_ids": ids, "attention_mask": attention, "position_ids": position, "prompts": ids[:, :P],
               "responses": ids[:, P:], "response_mask": mask, "old_log_probs": old_log_probs * mask,
               "advantages": adv[:, None] * mask, EDA_H_BAR_KEY: h_bar, EDA_H_OLD_KEY: h_old}
    return tensors, grpo_adv


def _policy(model, ids, attention, position):
    """Per-token log-prob of the response and full-vocabulary entropy, at the rollout temperature."""
    logits = model(input_ids=ids, attention_mask=attention, position_ids=position).logits[:, P - 1: -1]
    log_p = (logits / TEMPERATURE).log_softmax(-1)
    return log_p.gather(-1, ids[:, P:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def _legacy_layout(tensors):
    """The mini-batch as verl's legacy trainer hands it to the actor: ``left_right_2_no_padding`` of the padded
    batch (nested input ids and positions; the response fields and verl_ext's stay dense)."""
    from verl import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    return left_right_2_no_padding(DataProto.from_dict(tensors=dict(tensors)).to_tensordict())


def _engine_grads(engine, tensors, loss_fn, micro_batch_size, *, layout=_legacy_layout, use_remove_padding=False,
                  max_token_len=None, global_batch_size=B):
    """The full (all-gathered) gradient verl's engine accumulates over the mini-batch ``tensors`` (this rank's rows
    when several ranks call it together): fixed micro-batches of ``micro_batch_size`` rows, or verl's token-count
    micro-batches of at most ``max_token_len`` tokens when that is set."""
    from verl.utils import tensordict_utils as tu

    data = layout(tensors)
    tu.assign_non_tensor(data, calculate_entropy=True, global_batch_size=global_batch_size,
                         use_remove_padding=use_remove_padding, use_dynamic_bsz=max_token_len is not None,
                         micro_batch_size_per_gpu=micro_batch_size, max_token_len_per_gpu=max_token_len,
                         use_fused_kernels=False, temperature=TEMPERATURE)
    advantages_before = data["advantages"].clone()
    engine.optimizer_zero_grad()
    with engine.train_mode(zero_grad_on_exit=False):
        output = engine.forward_backward_batch(data, loss_function=loss_fn)
    if advantages_before.is_nested:
        advantages_before, after = advantages_before.values(), data["advantages"].values()
    else:
        after = data["advantages"]
    assert torch.equal(after, advantages_before)  # the mini-batch is read again by later epochs
    grads = {}
    for name, p in engine.module.named_parameters():
        grad = torch.zeros(p.shape) if p.grad is None else p.grad
        grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return grads, output["metrics"]


def _official_grads(reference, tensors, grpo_adv, actor_config, entropy_eps=1e-6):
    """Autograd of the official loss written out by hand (verl's vanilla PPO clip, dual clip c=3)."""
    reference.zero_grad()
    mask = tensors["response_mask"]
    log_probs, entropy = _policy(reference, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    h_now = (entropy * mask).sum(-1) / mask.sum(-1)
    h_bar, h_old = tensors[EDA_H_BAR_KEY], tensors[EDA_H_OLD_KEY]
    stored = tensors["advantages"][:, 0]
    official = grpo_adv * h_bar / h_now  # Â_i = A_i·H̄_g/H_i(θ); only H̄ is detached
    fallback = grpo_adv * h_bar / torch.where(h_old > 0, h_old, 1.0)  # the detached factor
    adv = torch.where(h_old > 0, torch.where(h_now.detach() > entropy_eps, official, fallback), stored)[:, None]
    ratio = torch.exp((log_probs - tensors["old_log_probs"]).clamp(-20, 20))
    _aggregate(_clipped_ppo(adv, ratio, actor_config), mask, actor_config).backward()
    return {name: p.grad.detach().clone() for name, p in reference.named_parameters()}


def _clipped_ppo(adv, ratio, actor_config):
    """verl's vanilla per-token PPO loss: clip, then the dual clip (c) for negative advantages."""
    low = actor_config.clip_ratio_low if actor_config.clip_ratio_low is not None else actor_config.clip_ratio
    high = actor_config.clip_ratio_high if actor_config.clip_ratio_high is not None else actor_config.clip_ratio
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - low, 1 + high))
    return torch.where(adv < 0, torch.minimum(-adv * actor_config.clip_ratio_c, clipped), clipped)


def _aggregate(per_token, mask, actor_config):
    """verl's five ``loss_agg_mode``s written out over the whole mini-batch (every rank's rows): its B rows (an empty
    row counts in B, as in verl's global_batch_size), N valid tokens, horizon ``loss_scale_factor``."""
    token_sums = (per_token * mask).sum(-1)
    rows, tokens = mask.shape[0], mask.sum(-1)
    mode = actor_config.loss_agg_mode
    if mode == "token-mean":
        return token_sums.sum() / tokens.sum()
    if mode == "token-sum":
        return token_sums.sum()
    if mode == "seq-mean-token-sum":
        return token_sums.sum() / rows
    if mode == "seq-mean-token-sum-norm":  # a horizon, or one per row
        return (token_sums / torch.as_tensor(actor_config.loss_scale_factor)).sum() / rows
    if mode == "seq-mean-token-mean":
        return (token_sums / tokens.clamp(min=1)).sum() / rows
    raise ValueError(f"unknown loss_agg_mode {mode}")


# fp32, two summation orders (verl's engine: per micro-batch, FSDP's flat parameters; the reference: one pass): up to
# 2.5e-5 relative measured on an AMD EPYC host (below 1e-5 on the host the test was written on); a wrong formula, a
# missing factor or a detached H_i(θ) is off by O(1e-2) or more
GRAD_RTOL = 1e-4


def _max_relative_error(ours: dict, expected: dict) -> float:
    return max(float((ours[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)) for n, g in expected.items())


@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("micro_batch_size", [8, 2])  # one micro-batch, and four accumulated
def test_engine_gradient_equals_the_hand_written_official_loss(engine_setup, loss_agg_mode, micro_batch_size):
    engine, actor_config, reference = engine_setup
    actor_config = dataclasses.replace(actor_config, loss_agg_mode=loss_agg_mode)
    tensors, grpo_adv = _batch(reference)
    grads, metrics = _engine_grads(engine, tensors, EntropyGradPPOLoss(actor_config), micro_batch_size)
    expected = _official_grads(reference, tensors, grpo_adv, actor_config)
    assert _max_relative_error(grads, expected) < GRAD_RTOL
    # and the entropy term matters: the detached rescaling's gradient is far from it
    detached, _ = _engine_grads(engine, tensors, EntropyGradPPOLoss(actor_config, entropy_eps=1e9), micro_batch_size)
    assert _max_relative_error(detached, expected) > 0.1
    summary = summarize_entropy_grad_metrics({f"actor/{k}": v for k, v in metrics.items()})
    assert summary[FALLBACK_FRAC] == 0.0 and 0.6 < summary[RATIO_MEAN] < 1.0  # H(old) was inflated by up to 30%


def test_engine_fallback_rows_use_the_detached_factor(engine_setup):
    engine, actor_config, reference = engine_setup
    tensors, grpo_adv = _batch(reference)
    with torch.no_grad():
        _, entropy = _policy(reference, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    h_now = (entropy * tensors["response_mask"]).sum(-1) / tensors["response_mask"].sum(-1)
    # half the responses count as degenerate now; eps halfway between two responses' entropies, not equal to one,
    # so float noise between the engine's forward and the reference's cannot move a response across it
    middle = h_now.sort().values[len(h_now) // 2 - 1: len(h_now) // 2 + 1]
    eps = float(middle.mean())
    grads, metrics = _engine_grads(engine, tensors, EntropyGradPPOLoss(actor_config, entropy_eps=eps), 2)
    expected = _official_grads(reference, tensors, grpo_adv, actor_config, entropy_eps=eps)
    assert _max_relative_error(grads, expected) < GRAD_RTOL
    summary = summarize_entropy_grad_metrics({f"actor/{k}": v for k, v in metrics.items()})
    assert summary[FALLBACK_FRAC] == pytest.approx(float((h_now <= eps).float().mean()))


def test_engine_all_fallback_is_verls_detached_gradient_exactly(engine_setup):
    from verl.workers.utils.losses import ppo_loss

    engine, actor_config, reference = engine_setup
    tensors, _ = _batch(reference)
    verl_grads, _ = _engine_grads(engine, tensors, partial(ppo_loss, config=actor_config), 2)
    ours, _ = _engine_grads(engine, tensors, EntropyGradPPOLoss(actor_config, entropy_eps=1e9), 2)
    assert all(torch.equal(ours[n], verl_grads[n]) for n in verl_grads)


# ---- gec.injected_loss=shaped ---------------------------------------------------------------------------------


def _shaped_batch(reference, seed=0):
    """The same batch with GEC's off-policy mask: a few spans of injected answer / solution tokens."""
    tensors, grpo_adv = _batch(reference, seed)
    tensors = {k: v for k, v in tensors.items() if k not in (EDA_H_BAR_KEY, EDA_H_OLD_KEY)}
    mask = tensors["response_mask"]
    off = torch.zeros_like(mask)
    off[0, 2:5] = off[2, 0:4] = off[3, 1:3] = off[6, 3:5] = off[7, 0:2] = 1  # rows of both signs of advantage
    tensors[OFF_POLICY_MASK_KEY] = off * mask
    tensors["advantages"] = grpo_adv[:, None] * mask
    return tensors


def _shaped_reference_grads(reference, tensors, actor_config, gamma):
    """Autograd of the loss written out by hand: LUFFY's -Â·p/(p+γ) on the off-policy tokens (no clip, no old
    probability), verl's clipped PPO on the others, aggregated together."""
    reference.zero_grad()
    mask = tensors["response_mask"]
    log_probs, _ = _policy(reference, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    adv = tensors["advantages"]
    ratio = torch.exp((log_probs - tensors["old_log_probs"]).clamp(-20, 20))
    prob = log_probs.exp()
    per_token = torch.where(tensors[OFF_POLICY_MASK_KEY].bool(), -adv * prob / (prob + gamma),
                            _clipped_ppo(adv, ratio, actor_config))
    _aggregate(per_token, mask, actor_config).backward()
    return {name: p.grad.detach().clone() for name, p in reference.named_parameters()}


@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("micro_batch_size", [8, 2])
def test_engine_gradient_of_the_shaped_loss_equals_the_hand_written_one(engine_setup, loss_agg_mode,
                                                                        micro_batch_size):
    engine, actor_config, reference = engine_setup
    actor_config = dataclasses.replace(actor_config, loss_agg_mode=loss_agg_mode)
    tensors = _shaped_batch(reference)
    grads, metrics = _engine_grads(engine, tensors, ShapedInjectedPPOLoss(actor_config, gamma=0.1), micro_batch_size)
    expected = _shaped_reference_grads(reference, tensors, actor_config, gamma=0.1)
    assert _max_relative_error(grads, expected) < GRAD_RTOL
    # and the shaping matters: the same tokens as policy tokens (verl's loss) give another gradient
    from verl.workers.utils.losses import ppo_loss

    as_policy, _ = _engine_grads(engine, tensors, partial(ppo_loss, config=actor_config), micro_batch_size)
    assert _max_relative_error(as_policy, expected) > 0.05
    with torch.no_grad():
        log_probs, _ = _policy(reference, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    off = tensors[OFF_POLICY_MASK_KEY].bool()
    summary = summarize_shaped_loss_metrics({f"actor/{k}": v for k, v in metrics.items()})
    assert summary[SHAPED_PROB_MEAN] == pytest.approx(log_probs.exp()[off].mean().item(), rel=1e-4)


def test_engine_shaped_loss_without_off_policy_tokens_is_verls_loss_exactly(engine_setup):
    from verl.workers.utils.losses import ppo_loss

    engine, actor_config, reference = engine_setup
    tensors = _shaped_batch(reference)
    tensors[OFF_POLICY_MASK_KEY] = torch.zeros_like(tensors[OFF_POLICY_MASK_KEY])
    verl_grads, _ = _engine_grads(engine, tensors, partial(ppo_loss, config=actor_config), 2)
    ours, _ = _engine_grads(engine, tensors, ShapedInjectedPPOLoss(actor_config), 2)
    assert all(torch.equal(ours[n], verl_grads[n]) for n in verl_grads)
