import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids

edge = get_adv_estimator_fn("edge_grpo")
grpo = get_adv_estimator_fn("grpo")


def test_hand_computed_two_member_group():
    R, M = outcome_batch([1.0, 0.0], [2, 1])
    E = torch.tensor([[0.2, 0.4], [0.6, 99.0]])  # 99 sits under the mask and must be ignored
    metrics = {}
    adv, ret = edge(token_level_rewards=R, response_mask=M, index=uids(2), config={}, entropy=E, metrics=metrics)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO: mean 0.5, unbiased std sqrt(0.5)
    # H = (0.3, 0.6), H̄ = 0.45 -> factors 1.5 and 0.75
    assert adv[0].tolist() == pytest.approx([1.5 * a, 1.5 * a], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([-0.75 * a, 0.0], rel=1e-5)
    assert torch.equal(adv, ret)
    assert metrics["edge_grpo/factor_max"] == pytest.approx(1.5)
    assert metrics["edge_grpo/unscaled_count"] == 0
    assert metrics["verl_ext/frac_adv_modified"] == 1.0


def test_constant_entropy_equals_verl_grpo():
    torch.manual_seed(0)
    R, M = outcome_batch(torch.randint(0, 2, (24,)).float(), torch.randint(1, 7, (24,)), width=8)
    index = uids(8, 8, 8)
    E = torch.full_like(M, 0.7)
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=index, config={}, entropy=E)
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=index)
    torch.testing.assert_close(adv, ref, rtol=1e-5, atol=1e-6)


def test_norm_adv_by_std_false_is_honoured():
    R, M = outcome_batch([1.0, 0.0, 0.0, 0.0], [1, 1, 1, 1])
    E = torch.ones_like(M)
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(4), config={"norm_adv_by_std_in_grpo": False},
                  entropy=E)
    assert adv[:, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_of_one_and_all_equal_rewards():
    R, M = outcome_batch([1.0, 1.0, 1.0, 0.3], [2, 2, 2, 2])
    E = torch.tensor([[0.1, 0.1], [0.5, 0.5], [0.9, 0.9], [0.05, 0.05]])
    metrics = {}
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(3, 1), config={}, entropy=E, metrics=metrics)
    assert torch.all(adv[:3] == 0)  # collapsed group stays 0
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=uids(3, 1))
    torch.testing.assert_close(adv[3], ref[3])  # singleton keeps factor 1
    assert metrics["edge_grpo/unscaled_count"] == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0])
def test_degenerate_entropy_is_handled_and_counted(bad):
    R, M = outcome_batch([1.0, 0.0, 0.0], [2, 2, 2])
    E = torch.tensor([[0.4, 0.4], [bad, bad], [0.2, 0.2]])
    metrics = {}
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(3), config={}, entropy=E, metrics=metrics)
    assert torch.isfinite(adv).all()
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=uids(3))
    torch.testing.assert_close(adv[1], ref[1])  # degenerate response keeps its GRPO advantage
    # H̄ over the valid members (0.4, 0.2) = 0.3
    assert adv[0, 0].item() == pytest.approx(ref[0, 0].item() * 0.3 / 0.4, rel=1e-5)
    assert metrics["edge_grpo/unscaled_count"] == 1
    assert metrics["edge_grpo/nonfinite_entropy_count"] == (0 if bad == 0.0 else 1)


def test_zero_length_response():
    R, M = outcome_batch([1.0, 0.0, 0.0], [2, 0, 1], width=2)
    E = torch.full((3, 2), float("nan"))
    E[0], E[2, 0] = 0.5, 0.25
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(3), config={}, entropy=E)
    assert torch.isfinite(adv).all()
    assert torch.all(adv[1] == 0)  # zero where the mask is zero
    assert adv[2, 1] == 0


def test_factor_clamp_option():
    R, M = outcome_batch([1.0, 0.0], [1, 1])
    E = torch.tensor([[0.01], [1.0]])
    cfg = {"edge_grpo": {"factor_min": 0.5, "factor_max": 2.0}}
    adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(2), config=cfg, entropy=E)
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=uids(2))
    assert adv[0, 0].item() == pytest.approx(2.0 * ref[0, 0].item(), rel=1e-5)  # 0.505 / 0.01 clamped to 2
    assert adv[1, 0].item() == pytest.approx(0.505 * ref[1, 0].item(), rel=1e-5)  # 0.505 / 1.0 within range


def test_missing_entropy_is_a_clear_error():
    R, M = outcome_batch([1.0, 0.0], [1, 1])
    with pytest.raises(ValueError, match="edge_grpo needs the per-token entropy"):
        edge(token_level_rewards=R, response_mask=M, index=uids(2), config={})


def test_accepts_dictconfig_and_verl_algo_dataclass():
    from omegaconf import OmegaConf
    from verl.trainer.config import AlgoConfig

    R, M = outcome_batch([1.0, 0.0, 1.0], [1, 1, 1])
    E = torch.tensor([[0.3], [0.6], [0.9]])
    base, _ = edge(token_level_rewards=R, response_mask=M, index=uids(3), config={}, entropy=E)
    for cfg in (OmegaConf.create({"norm_adv_by_std_in_grpo": True, "edge_grpo": {}}), AlgoConfig(), None):
        adv, _ = edge(token_level_rewards=R, response_mask=M, index=uids(3), config=cfg, entropy=E)
        torch.testing.assert_close(adv, base)
    assert np.isfinite(base.numpy()).all()
