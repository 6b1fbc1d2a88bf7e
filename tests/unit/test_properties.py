"""Permutation invariance: reordering responses (within and across groups) permutes the advantages the same way."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from verl_ext import GroupEntropyHistory


@st.composite
def batches(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    n = sum(sizes)
    width = draw(st.integers(1, 4))
    rewards = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))
    lengths = torch.tensor(draw(st.lists(st.integers(1, width), min_size=n, max_size=n)))
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    R = torch.zeros(n, width)
    R[torch.arange(n), lengths - 1] = rewards
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    E = torch.rand(n, width, generator=gen) + 0.05
    L = -torch.rand(n, width, generator=gen)
    index = np.array([f"u{g}" for g, s in enumerate(sizes) for _ in range(s)], dtype=object)
    perm = torch.from_numpy(np.random.default_rng(draw(st.integers(0, 2**16))).permutation(n))
    return R, mask, E, L, index, perm


def run(name, R, M, E, L, index):
    fn = get_adv_estimator_fn(name)
    extra = {"old_log_probs": L, "entropy_history": GroupEntropyHistory()} if name == "gepo" else {}
    return fn(token_level_rewards=R, response_mask=M, index=index, config={}, entropy=E, **extra)[0]


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["edge_grpo", "gepo"]))
def test_permutation_invariance(batch, name):
    R, M, E, L, index, perm = batch
    adv = run(name, R, M, E, L, index)
    adv_perm = run(name, R[perm], M[perm], E[perm], L[perm], index[perm.numpy()])
    torch.testing.assert_close(adv_perm, adv[perm], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(adv).all()
    assert torch.all(adv[M == 0] == 0)
