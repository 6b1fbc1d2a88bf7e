"""GEPO's base advantage: grpo (paper), drgrpo (no std) and rloo (Intern-S2), against verl's own estimators."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext import GroupEntropyHistory

gepo = get_adv_estimator_fn("gepo")
UNREACHABLE = {"beta_low": 1e9, "beta_high": 1e9}  # thresholds no group crosses: gepo == its base


def random_batch(seed=0, sizes=(8, 8, 5, 1, 3)):
    """Groups of different sizes (one singleton), shaped rewards, ragged lengths."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    R, M = outcome_batch(torch.rand(n, generator=gen).round(decimals=1), torch.randint(1, 7, (n,), generator=gen),
                         width=6)
    L = -torch.rand(n, 6, generator=gen) * 2
    return R, M, L, uids(*sizes)


def run_gepo(base, R, M, L, index, norm=True, **gepo_cfg):
    cfg = {"norm_adv_by_std_in_grpo": norm, "gepo": {"base": base, **gepo_cfg}}
    metrics = {}
    adv, _ = gepo(token_level_rewards=R.clone(), response_mask=M, index=index, config=cfg, old_log_probs=L,
                  entropy_history=GroupEntropyHistory(), metrics=metrics)
    return adv, metrics


@pytest.mark.parametrize("norm", [True, False])
def test_drgrpo_base_is_verls_grpo_without_std_whatever_the_norm_flag(norm):
    R, M, L, index = random_batch()
    adv, _ = run_gepo("drgrpo", R, M, L, index, norm=norm, **UNREACHABLE)
    ref, _ = get_adv_estimator_fn("grpo")(token_level_rewards=R.clone(), response_mask=M, index=index,
                                          norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, ref, rtol=1e-5, atol=1e-6)
    # and base=grpo with verl's Dr.GRPO flag is the same thing
    grpo_no_std, _ = run_gepo("grpo", R, M, L, index, norm=False, **UNREACHABLE)
    torch.testing.assert_close(grpo_no_std, ref, rtol=1e-5, atol=1e-6)


def test_rloo_base_is_verls_rloo():
    R, M, L, index = random_batch()
    adv, _ = run_gepo("rloo", R, M, L, index, **UNREACHABLE)
    ref, _ = get_adv_estimator_fn("rloo")(token_level_rewards=R.clone(), response_mask=M, index=index)
    torch.testing.assert_close(adv, ref, rtol=1e-5, atol=1e-6)  # including the singleton (keeps its reward)
    vec, _ = get_adv_estimator_fn("rloo_vectorized")(token_level_rewards=R.clone(), response_mask=M, index=index)
    multi = np.asarray(index) != "g3"  # rloo_vectorized zeroes singletons; elsewhere all three agree
    torch.testing.assert_close(adv[multi], vec[multi], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("base", ["drgrpo", "rloo"])
def test_shaping_applies_to_the_chosen_base(base):
    # three [1, 0] groups with H_g = 0.1, 0.5, 0.9: low group's positive x 0.5, high group's negative x 0.2
    R, M = outcome_batch([1.0, 0.0] * 3, [1] * 6)
    L = -torch.tensor([[h] for h in (0.1, 0.5, 0.9) for _ in range(2)])
    index = uids(2, 2, 2)
    a = {"drgrpo": 0.5, "rloo": 1.0}[base]  # r - mean, and r - the other response's reward
    adv, metrics = run_gepo(base, R, M, L, index)
    assert adv[:, 0].tolist() == pytest.approx([0.5 * a, -a, a, -a, a, -0.2 * a], rel=1e-6)
    assert metrics["verl_ext/frac_adv_modified"] == pytest.approx(2 / 6)  # relative to the base, not to GRPO


def test_unknown_base_is_a_config_error():
    from verl_ext.config import ConfigError, load_algorithm_config

    with pytest.raises(ConfigError, match=r"algorithm\.gepo\.base='dapo'.*'grpo', 'drgrpo', 'rloo', 'edge_grpo'"):
        load_algorithm_config({"gepo": {"base": "dapo"}})
