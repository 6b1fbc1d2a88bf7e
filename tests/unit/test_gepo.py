import json
import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext import GroupEntropyHistory
from verl_ext.config import ConfigError, load_algorithm_config

gepo = get_adv_estimator_fn("gepo")
grpo = get_adv_estimator_fn("grpo")
A = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO advantage of a [1, 0] group


def three_groups(entropies=(0.1, 0.5, 0.9)):
    """Three [1, 0] groups whose sampled-token NLL per token is the given H_g."""
    R, M = outcome_batch([1.0, 0.0] * 3, [1] * 6)
    L = -torch.tensor([[h] for h in entropies for _ in range(2)])
    return R, M, L, uids(2, 2, 2)


def test_hand_computed_shaping_and_thresholds():
    R, M, L, index = three_groups()
    history, metrics = GroupEntropyHistory(), {}
    adv, ret = gepo(token_level_rewards=R, response_mask=M, index=index, config={}, old_log_probs=L,
                    entropy_history=history, metrics=metrics)
    sigma = math.sqrt((0.4**2 * 2) / 3)  # population std of (0.1, 0.5, 0.9)
    assert history.thresholds() == pytest.approx((0.5 - 0.2 * sigma, 0.5 + 0.3 * sigma), rel=1e-5)
    # low-H group: positive x 0.5, negative untouched; mid: untouched; high-H: negative x 0.2
    assert adv[:, 0].tolist() == pytest.approx([0.5 * A, -A, A, -A, A, -0.2 * A], rel=1e-5)
    assert torch.equal(adv, ret)
    assert metrics["gepo/frac_pos_attenuated"] == pytest.approx(1 / 3)
    assert metrics["gepo/frac_neg_attenuated"] == pytest.approx(1 / 3)
    assert metrics["gepo/H_mean"] == pytest.approx(0.5)
    assert metrics["gepo/H_low"] == pytest.approx(0.5 - 0.2 * sigma, rel=1e-5)
    assert metrics["verl_ext/frac_adv_modified"] == pytest.approx(2 / 6)


def test_unreachable_thresholds_equal_verl_grpo_exactly():
    torch.manual_seed(1)
    R, M = outcome_batch(torch.randint(0, 2, (32,)).float(), torch.randint(1, 6, (32,)), width=6)
    L = -torch.rand(32, 6)
    index = uids(*[8] * 4)
    cfg = {"gepo": {"beta_low": 1e9, "beta_high": 1e9}}
    adv, _ = gepo(token_level_rewards=R, response_mask=M, index=index, config=cfg, old_log_probs=L,
                  entropy_history=GroupEntropyHistory())
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=index)
    torch.testing.assert_close(adv, ref, rtol=1e-5, atol=1e-6)


def test_token_mean_group_entropy_ignores_response_length():
    from verl_ext.algos.gepo import group_entropy
    from verl_ext.algos.groups import group_ids

    _, M = outcome_batch([0, 0, 0, 0], [1, 5, 2, 2], width=5)
    L = torch.full((4, 5), -0.3)
    L[M == 0] = float("nan")  # whatever sits under the mask is ignored
    gid, n = group_ids(uids(2, 2))
    h = group_entropy("token_mean", M, gid, n, log_probs=L)
    torch.testing.assert_close(h, torch.tensor([0.3, 0.3]))
    h_sum = group_entropy("sum_mean", M, gid, n, log_probs=L)  # Intern-S2: per-response sums / K
    torch.testing.assert_close(h_sum, torch.tensor([0.9, 0.6]))
    E = torch.where(M > 0, torch.full_like(L, 1.2), L)
    torch.testing.assert_close(group_entropy("full_entropy", M, gid, n, entropy=E), torch.tensor([1.2, 1.2]))


def test_ema_is_seeded_then_moves_by_gamma():
    history = GroupEntropyHistory()
    R, M, L, index = three_groups((0.1, 0.5, 0.9))
    gepo(token_level_rewards=R, response_mask=M, index=index, config={}, old_log_probs=L, entropy_history=history)
    low1, high1 = history.thresholds()
    assert low1 > 0.4  # seeded by the first estimate, not 0
    R, M, L, index = three_groups((1.1, 1.5, 1.9))  # same spread, mean moved by +1
    gepo(token_level_rewards=R, response_mask=M, index=index, config={}, old_log_probs=L, entropy_history=history)
    low2, high2 = history.thresholds()
    assert low2 == pytest.approx(0.99 * low1 + 0.01 * (low1 + 1.0), rel=1e-6)
    assert high2 == pytest.approx(0.99 * high1 + 0.01 * (high1 + 1.0), rel=1e-6)
    assert history.num_updates() == 2


def test_update_after_shaping_uses_previous_thresholds():
    history = GroupEntropyHistory()  # today's (version 1) checkpoint format: nothing is low or high
    history.load_state_dict({"version": 1, "scopes": {"global": {"h_low": 0.0, "h_high": 10.0, "num_updates": 1}}})
    R, M, L, index = three_groups()
    cfg = {"gepo": {"update_before_shaping": False}}
    adv, _ = gepo(token_level_rewards=R, response_mask=M, index=index, config=cfg, old_log_probs=L,
                  entropy_history=history)
    ref, _ = grpo(token_level_rewards=R, response_mask=M, index=index)
    torch.testing.assert_close(adv, ref)
    assert history.num_updates() == 2


def test_history_json_round_trip_reproduces_shaping():
    R, M, L, index = three_groups()
    h1 = GroupEntropyHistory()
    gepo(token_level_rewards=R, response_mask=M, index=index, config={}, old_log_probs=L, entropy_history=h1)
    h2 = GroupEntropyHistory()
    h2.load_state_dict(json.loads(json.dumps(h1.state_dict())))
    R2, M2, L2, index2 = three_groups((0.2, 0.45, 1.0))
    a1, _ = gepo(token_level_rewards=R2, response_mask=M2, index=index2, config={}, old_log_probs=L2,
                 entropy_history=h1)
    a2, _ = gepo(token_level_rewards=R2, response_mask=M2, index=index2, config={}, old_log_probs=L2,
                 entropy_history=h2)
    assert torch.equal(a1, a2) and h1.state_dict() == h2.state_dict()
    with pytest.raises(ValueError, match="GroupEntropyHistory"):
        GroupEntropyHistory().load_state_dict({"scopes": {}})


def test_per_data_source_scope_keeps_separate_thresholds():
    R, M, L, index = three_groups((0.1, 0.5, 3.0))
    ds = np.array(["math"] * 4 + ["code"] * 2, dtype=object)
    history, metrics = GroupEntropyHistory(), {}
    adv, _ = gepo(token_level_rewards=R, response_mask=M, index=index, data_source=ds, old_log_probs=L,
                  config={"gepo": {"stats_scope": "per_data_source"}}, entropy_history=history, metrics=metrics)
    assert history.scopes() == ["code", "math"]
    assert history.thresholds("code") == pytest.approx((3.0, 3.0))  # one group: sigma 0
    assert "gepo/math/H_low" in metrics and "gepo/code/frac_neg_attenuated" in metrics
    # code's only group is at its own mean: untouched, although it is far above the global mean
    assert adv[4:, 0].tolist() == pytest.approx([A, -A], rel=1e-5)
    with pytest.raises(ValueError, match="needs data_source"):
        gepo(token_level_rewards=R, response_mask=M, index=index, old_log_probs=L,
             config={"gepo": {"stats_scope": "per_data_source"}})


def test_base_edge_grpo_shapes_eda_advantages():
    R, M, L, index = three_groups()
    E = torch.tensor([[0.2], [0.4], [0.5], [0.5], [0.5], [0.5]])
    cfg = {"gepo": {"base": "edge_grpo"}}
    adv, _ = gepo(token_level_rewards=R, response_mask=M, index=index, config=cfg, old_log_probs=L, entropy=E,
                  entropy_history=GroupEntropyHistory())
    # group 0: EDA factors 0.3/0.2 and 0.3/0.4, then the positive is damped by 0.5
    assert adv[:2, 0].tolist() == pytest.approx([0.5 * 1.5 * A, -0.75 * A], rel=1e-5)


def test_nonfinite_group_entropy_is_not_shaped_and_counted():
    R, M, L, index = three_groups()
    L[0, 0] = float("nan")
    metrics = {}
    adv, _ = gepo(token_level_rewards=R, response_mask=M, index=index, config={}, old_log_probs=L,
                  entropy_history=GroupEntropyHistory(), metrics=metrics)
    assert torch.isfinite(adv).all()
    assert adv[:2, 0].tolist() == pytest.approx([A, -A], rel=1e-5)
    assert metrics["gepo/nonfinite_group_entropy_count"] == 1


def test_missing_inputs_and_alpha_order_are_clear_errors():
    R, M, L, index = three_groups()
    with pytest.raises(ValueError, match="needs old_log_probs"):
        gepo(token_level_rewards=R, response_mask=M, index=index, config={})
    with pytest.raises(ConfigError, match=r"algorithm\.gepo\.alpha_high=0\.6.*length collapse"):
        gepo(token_level_rewards=R, response_mask=M, index=index, old_log_probs=L,
             config={"gepo": {"alpha_high": 0.6}})
    # the explicit override flag lets it run
    gepo(token_level_rewards=R, response_mask=M, index=index, old_log_probs=L,
         config={"gepo": {"alpha_high": 0.6, "enforce_alpha_order": False}})
    assert load_algorithm_config({"gepo": {"alpha_high": 0.6, "enforce_alpha_order": False}}).gepo.alpha_high == 0.6
