"""End-to-end: ``examples/toy/train.sh`` really trains (not a dry run), stops, and resumes.

What it proves: the script's overrides reach verl's real pipeline; verl's file logger writes every step to
``$RUN_DIR/metrics.jsonl`` (the path the script exports and puts in the Ray job's runtime_env), checkpoints land in
``$RUN_DIR/checkpoints``; running the script again resumes from the latest checkpoint and keeps the earlier metrics
file (verl's file logger would truncate it). The run is GEPO with per-data-source thresholds on the legacy trainer
(``trainer.use_v1=false``; the toy's default is v1), so it also proves that GEPO's driver-side history goes into the checkpoint and comes
back exactly, then keeps counting (v1's save/kill/resume: test_combinations' colocate_async test). Two short runs of
the toy task (2 steps, then 1 more), ~3 min on 2 cores.

The same runs carry the legacy trainer's combination of docs/combinations.md (CI time: one run proves both): EDA and
GEPO in one estimator (``gepo.base=edge_grpo``) with GEC on, Dr.GRPO (no std, ``seq-mean-token-sum-norm``), a KL
loss against a reference model and 2 PPO epochs over 2 mini-batches: the ratio leaves 1 (GEC's injected tokens
included) and every loss and grad norm stays finite, before and after the resume.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import SMALL_RUN, assert_shaped_training, read_metrics
from verl_ext.trainer.history_checkpoint import STATE_FILE

REPO = Path(__file__).resolve().parents[2]


def _steps(path: Path) -> list[int]:
    return sorted(read_metrics(path))


@pytest.mark.e2e
def test_toy_script_trains_logs_to_run_dir_and_resumes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RUN_DIR", "DRY_RUN", "WANDB_API_KEY")}
    env.update(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), METHOD="gepo", SEED="3",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    overrides = [o for o in SMALL_RUN if not o.startswith(("trainer.total_training_steps", "trainer.save_freq"))]
    overrides += ["trainer.use_v1=false", "algorithm.gepo.stats_scope=per_data_source"]  # the legacy trainer's path
    overrides += ["algorithm.gepo.base=edge_grpo", "algorithm.gec.enable=true",  # EDA + GEPO + GEC
                  "algorithm.norm_adv_by_std_in_grpo=false", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                  "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
                  "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"]
    run_dir = tmp_path / "out" / "verl_ext_toy" / "toy_gepo_seed3"

    def train(steps: int) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(REPO / "examples" / "toy" / "train.sh"), *overrides, "trainer.save_freq=1"],
                              env={**env, "STEPS": str(steps)}, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
        return proc

    def history(step: int) -> dict:
        return json.loads((run_dir / "checkpoints" / f"global_step_{step}" / STATE_FILE).read_text())["entropy_history"]

    def combination_trained(steps: dict, expected: list[int]) -> None:
        assert_shaped_training(steps, expected)
        for values in steps.values():
            assert math.isfinite(values["actor/kl_loss"]) and math.isfinite(values["actor/ppo_kl"])
        # 2 epochs x 2 mini-batches moved the policy within the step (ratio != 1) and away from the reference
        assert max(abs(v["actor/ppo_kl"]) for v in steps.values()) > 0

    train(2)
    assert _steps(run_dir / "metrics.jsonl") == [1, 2]
    combination_trained(read_metrics(run_dir / "metrics.jsonl"), [1, 2])
    first = read_metrics(run_dir / "metrics.jsonl")[2]
    assert first["actor/kl_loss"] > 0
    assert "verl_ext/collapsed_group_frac" in first  # verl_ext's step metrics reached the file
    # GEPO's history in the checkpoint: one update per step in which the data source had groups (a 4-prompt batch
    # need not hold both sources), as logged
    saved = history(2)
    assert saved["scopes"] and max(s["num_updates"] for s in saved["scopes"].values()) == 2
    for scope, state in saved["scopes"].items():
        assert state["num_updates"] == first[f"gepo/{scope}/history_updates"] >= 1, (scope, state, first)
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert any((run_dir / "hydra").iterdir())  # Hydra's record of the run, not in the working directory
    assert not (tmp_path / "outputs").exists()

    proc = train(3)  # the same name: resumes from global_step_2, trains step 3
    output = proc.stdout + proc.stderr
    assert "global_step_2" in output
    assert _steps(run_dir / "metrics.jsonl") == [3]
    logged = read_metrics(run_dir / "metrics.jsonl")[3]
    # the combination after the resume (one step: finite, not necessarily an update, a zero-advantage step is legal)
    assert all(math.isfinite(logged[k]) for k in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/ppo_kl"))
    restored = [line for line in output.splitlines() if "[verl_ext] restored entropy history" in line]
    assert restored and json.loads(restored[0].split(": ", 1)[1]) == saved  # the thresholds before the stop, exactly
    after = history(3)
    for scope, state in saved["scopes"].items():  # then updates on top of them, not a re-seed
        assert after["scopes"][scope]["num_updates"] == logged[f"gepo/{scope}/history_updates"]
        assert state["num_updates"] <= after["scopes"][scope]["num_updates"] <= state["num_updates"] + 1
    assert sum(s["num_updates"] for s in after["scopes"].values()) > sum(s["num_updates"] for s in saved["scopes"].values())
    (kept,) = run_dir.glob("metrics.*.jsonl")
    assert _steps(kept) == [1, 2]
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
