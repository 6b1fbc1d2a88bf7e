"""End to end: ``algorithm.gec.mode=hint`` on the toy's hard split, 2 steps, on verl's v1 trainer with the ``hf``
backend, scope ``one`` (the legacy trainer with scope ``all``: tests/e2e/test_compare.py, whose round runs
``grpo_hint_all``; one run fewer, CI time).

What it proves: the hint mode runs in verl's real pipeline (Ray, FSDP on gloo, the agent loop, TransferQueue, verl's
reward loop and batch building): all-wrong groups get hinted samples at the cut levels, the step logs the ``hint/*``
metrics, a hinted row is the policy's own sampling (verl's rollout-vs-actor diagnostics read 0, no token is GEC's),
and scope ``one`` replaces at most one member of a hinted group. The toy's prompts (~29 tokens) leave no room for a
hint in the demo's 32-token prompt budget: 64 here (docs/hints.md).
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.conftest import SAMPLED_TOKEN_PROB_TOL

pytestmark = pytest.mark.e2e

HINTS = ["algorithm.gec.mode=hint", "+toy.train_sources=[toy_chain5]", "data.max_prompt_length=64"]


def test_hints_train_on_the_hard_split_on_v1_scope_one(run_main):
    run = run_main(*HINTS, "trainer.use_v1=true", "algorithm.gec.hint_scope=one")
    steps = run.metrics()
    assert sorted(steps) == [1, 2]
    assert sum(values["hint/groups_hinted"] for values in steps.values()) > 0  # the hard split starts all wrong
    for step, values in steps.items():
        hinted, replaced = values["hint/groups_hinted"], values["hint/replaced"]
        assert values["hint/level0/samples"] >= hinted  # every hinted group starts at the lowest level
        assert values["hint/skipped/prompt_too_long"] == 0 and values["hint/skipped/no_solution"] == 0
        assert replaced <= hinted, (step, values)
        # hinted rows are sampled rows: nothing injected, the rollout's log-probs are the actor's
        assert values["gec/injected_token_frac"] == 0
        assert values["training/rollout_probs_diff_max"] < SAMPLED_TOKEN_PROB_TOL
        assert math.isfinite(values["actor/pg_loss"]) and math.isfinite(values["actor/grad_norm"])
