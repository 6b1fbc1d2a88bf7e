"""End to end: a seeded run does not depend on how the `hf` server happens to batch its requests.

Which requests share a batch depends on their arrival times, i.e. on machine load. Two seeded 20-step runs of the
small default, one closing a batch as soon as the queue stops growing (``batch_window_ms=0``), one waiting 200 ms
for more, must log the same outcome metrics at every step, bit for bit. That includes the rollout-vs-actor float
diagnostics (``rollout_corr/*``, ``training/rollout_*``): they carry the rollout's log-probs, so a batch-dependent
rollout shows there from the first step, before any sampled token flips. That the runs are not identical by
accident (a rollout that ignores its seed) is a unit test's: rollout.seed from the config changes what a request
samples (tests/unit/test_hf_rollout.py::test_server_seeds_requests_by_identity_not_arrival).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

STEPS = 20
SEED = ["data.seed=3", "actor_rollout_ref.rollout.seed=3", f"trainer.total_training_steps={STEPS}"]
HF = "+actor_rollout_ref.rollout.engine_kwargs.hf"

# wall-clock and memory measurements, never equal between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "agent_loop/", "time/")


def _outcomes(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {step: {k: v for k, v in values.items()
                   if not (k.startswith(TIMING_PREFIXES) or "/perf/" in k or "memory" in k)}
            for step, values in steps.items()}


def test_the_batching_window_changes_no_metric(run_main):
    eager = _outcomes(run_main(*SEED, f"{HF}.batch_window_ms=0", timeout=900).metrics())
    patient = _outcomes(run_main(*SEED, f"{HF}.batch_window_ms=200", f"{HF}.max_batch_wait_ms=400",
                                 timeout=900).metrics())
    assert sorted(eager) == list(range(1, STEPS + 1))
    assert max(values["actor/grad_norm"] for values in eager.values()) > 0  # the runs trained
    assert any(k.startswith("rollout_corr/") or k.startswith("training/rollout_") for k in eager[1])
    for step, values in eager.items():
        assert len(values) > 50 and values.keys() == patient[step].keys()
        diff = {k: (v, patient[step][k]) for k, v in values.items() if v != patient[step][k]}
        assert not diff, f"step {step}: {sorted(diff.items())[:20]}"
