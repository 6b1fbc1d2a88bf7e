"""Strict inputs at the estimator boundary: every malformed argument is a ValueError that names it."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext import GroupEntropyHistory

ESTIMATORS = ["edge_grpo", "gepo"]
B, T = 6, 4


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    R, M = outcome_batch(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([4, 2, 3, 1, 4, 2]), width=T)
    return {"token_level_rewards": R, "response_mask": M, "index": uids(2, 2, 2),
            "entropy": torch.rand(B, T, generator=gen) + 0.1, "old_log_probs": -torch.rand(B, T, generator=gen),
            "config": {}, "entropy_history": GroupEntropyHistory()}


def call(estimator, **overrides):
    kwargs = {**batch(), **overrides}
    if estimator == "edge_grpo":
        kwargs.pop("entropy_history")
    return get_adv_estimator_fn(estimator)(**kwargs)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("name", ["response_mask", "entropy", "old_log_probs", "rollout_log_probs"])
def test_every_batch_tensor_must_have_the_rewards_shape(estimator, name):
    # rollout_log_probs (and old_log_probs for edge_grpo) are not read with the default options: checked anyway
    with pytest.raises(ValueError, match=rf"^{name} has shape \(6, 5\), but token_level_rewards has \(6, 4\)"):
        call(estimator, **{name: torch.zeros(B, T + 1)})
    with pytest.raises(ValueError, match=rf"^{name} has shape \(5, 4\)"):
        call(estimator, **{name: torch.zeros(B - 1, T)})


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_rewards_must_be_a_2d_tensor(estimator):
    with pytest.raises(ValueError, match=r"token_level_rewards must be 2-D \(B, T\), got shape \(6,\)"):
        call(estimator, token_level_rewards=torch.zeros(B))
    with pytest.raises(ValueError, match="token_level_rewards must be a .* torch.Tensor, got list"):
        call(estimator, token_level_rewards=[[0.0] * T] * B)
    with pytest.raises(ValueError, match="entropy must be a torch.Tensor .* got ndarray"):
        call(estimator, entropy=np.zeros((B, T)))
    with pytest.raises(ValueError, match="response_mask is required"):
        call(estimator, response_mask=None)
    with pytest.raises(ValueError, match="old_log_probs must be a floating-point tensor"):
        call(estimator, old_log_probs=torch.ones(B, T, dtype=torch.bool))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_index_and_data_source_need_one_entry_per_response(estimator):
    with pytest.raises(ValueError, match=r"^index must have one entry per response: B = 6 .* got 5 entries"):
        call(estimator, index=uids(2, 2, 1))
    with pytest.raises(ValueError, match=r"^index must have one entry per response: B = 6 .* got shape \(3, 2\)"):
        call(estimator, index=uids(2, 2, 2).reshape(3, 2))
    with pytest.raises(ValueError, match=r"^index is required"):
        call(estimator, index=None)
    # data_source is checked whenever given, even with stats_scope=global where it is not read
    with pytest.raises(ValueError, match=r"^data_source must have one entry per response: B = 6 .* got 7 entries"):
        call(estimator, data_source=["a"] * 7)
    call(estimator, data_source=["a"] * B, index=torch.tensor([0, 0, 1, 1, 2, 2]))  # tensors and lists are fine


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_non_finite_rewards_say_how_many_rows_and_which(estimator):
    R = batch()["token_level_rewards"].clone()
    R[1, 0], R[4, 3] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"token_level_rewards: 2 of 6 rows have a non-finite reward \(NaN/inf\), "
                                         r"rows \[1, 4\]; .*reward function"):
        call(estimator, token_level_rewards=R)
    R = torch.full((40, T), float("nan"))
    with pytest.raises(ValueError, match=r"40 of 40 rows .* rows \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\] and 30 more"):
        call(estimator, token_level_rewards=R, response_mask=torch.ones(40, T), index=np.arange(40) // 4,
             entropy=torch.ones(40, T), old_log_probs=-torch.ones(40, T))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_dtype_mismatches_are_handled(estimator):
    reference, _ = call(estimator)
    data = batch()
    as_int, _ = call(estimator, token_level_rewards=data["token_level_rewards"].long())  # integer rewards
    assert as_int.dtype == torch.float32
    torch.testing.assert_close(as_int, reference)
    for mask in (data["response_mask"].bool(), data["response_mask"].int()):
        adv, _ = call(estimator, response_mask=mask)
        torch.testing.assert_close(adv, reference)
    half, _ = call(estimator, entropy=data["entropy"].bfloat16(), old_log_probs=data["old_log_probs"].half())
    torch.testing.assert_close(half, reference, rtol=2e-2, atol=2e-2)
    double, _ = call(estimator, token_level_rewards=data["token_level_rewards"].double())
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), reference)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_device_mismatches_are_handled(estimator):
    reference, _ = call(estimator)
    data = batch()
    adv, _ = call(estimator, token_level_rewards=data["token_level_rewards"].cuda(),
                  old_log_probs=data["old_log_probs"].cuda())
    assert adv.device.type == "cuda"
    torch.testing.assert_close(adv.cpu(), reference)
