"""End-to-end: ``examples/toy/train.sh`` really trains (not a dry run) and its run can be reported and resumed.

What it proves: the script's overrides reach verl's real pipeline; verl's file logger writes every step to
``$RUN_DIR/metrics.jsonl`` (the path the script exports and puts in the Ray job's runtime_env), checkpoints land in
``$RUN_DIR/checkpoints``; running the script again resumes from the latest checkpoint and keeps the earlier metrics
file (verl's file logger would truncate it). Two short runs of the toy task (2 steps, then 1 more), ~3 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import SMALL_RUN

REPO = Path(__file__).resolve().parents[2]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.e2e
def test_toy_script_trains_logs_to_run_dir_and_resumes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RUN_DIR", "DRY_RUN", "WANDB_API_KEY")}
    env.update(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), METHOD="gepo", SEED="3",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    overrides = [o for o in SMALL_RUN if not o.startswith(("trainer.total_training_steps", "trainer.save_freq"))]
    run_dir = tmp_path / "out" / "verl_ext_toy" / "toy_gepo_seed3"

    def train(steps: int) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(REPO / "examples" / "toy" / "train.sh"), *overrides, "trainer.save_freq=1"],
                              env={**env, "STEPS": str(steps)}, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
        return proc

    train(2)
    assert _steps(run_dir / "metrics.jsonl") == [1, 2]
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["data"]
    assert "gepo/H_low" in first and "verl_ext/collapsed_group_frac" in first  # the estimator's own metrics
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert any((run_dir / "hydra").iterdir())  # Hydra's record of the run, not in the working directory
    assert not (tmp_path / "outputs").exists()

    proc = train(3)  # the same name: resumes from global_step_2, trains step 3
    assert "global_step_2" in proc.stdout + proc.stderr
    assert _steps(run_dir / "metrics.jsonl") == [3]
    (kept,) = run_dir.glob("metrics.*.jsonl")
    assert _steps(kept) == [1, 2]
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
