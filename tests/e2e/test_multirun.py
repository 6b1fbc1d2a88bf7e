"""Hydra multirun (``python -m verl_ext.main -m ...``) on the real pipeline: two toy jobs in one invocation, each
in its own folder with its own metrics and checkpoints, Ray shut down and started afresh between them; then the
run report on the sweep folder.

Both jobs also run GEC's three credit options on the legacy trainer (CI time: one run proves both), one job through
verl's own estimator (grpo), one through verl_ext's (gepo, whose history must still take one update per step
although the estimator also runs on the first attempts' rewards): edits only in all-wrong groups, the first
attempt's tokens credited by its own reward, the injected answer/solution tokens trained with LUFFY's shaped loss."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import SMALL_RUN, Run, read_metrics

pytestmark = pytest.mark.e2e

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CREDIT_OPTIONS = ["algorithm.gec.edit_scope=all_wrong_groups", "algorithm.gec.prefix_advantage=before",
                  "algorithm.gec.injected_loss=shaped"]


def test_two_job_multirun_each_job_in_its_own_folder_then_the_report(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    sweep_dir = tmp_path / "multirun"
    # the embedded default's own logger ([console, file]) and checkpoint folder (the job's folder)
    args = [sys.executable, "-m", "verl_ext.main", "-m", "algorithm.adv_estimator=grpo,gepo",
            f"hydra.sweep.dir={sweep_dir}", *SMALL_RUN, "trainer.save_freq=2", "trainer.use_v1=false", *CREDIT_OPTIONS]
    run = Run(subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900))
    assert run.returncode == 0, f"{' '.join(args)} failed:\n{run.tail()}"
    assert run.output.count("ray init kwargs") == 2  # the second job found Ray shut down and started its own

    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0_toy_grpo", "1_toy_gepo"]
    for job, estimator in zip(jobs, ["grpo", "gepo"]):
        steps = read_metrics(job / "metrics.jsonl")
        assert sorted(steps) == [1, 2]
        assert max(values["actor/grad_norm"] for values in steps.values()) > 0  # updated (see test_pipeline)
        for step, values in steps.items():
            assert "verl_ext/collapsed_group_frac" in values
            assert ("gepo/H_low" in values) == (estimator == "gepo")
            if estimator == "gepo":
                assert values["gepo/history_updates"] == step  # the r0 pass left the run's history alone
            # the credit options ran: out-of-scope wrong responses counted, prefixes re-credited, injected tokens
            # trained off-policy (the loss reports their probability when a step had any)
            assert {"gec/count/group_not_all_wrong", "gec/credit/prefix_token_count",
                    "gec/credit/off_policy_token_count"} <= set(values), sorted(values)
            assert math.isfinite(values["actor/pg_loss"]) and math.isfinite(values["actor/grad_norm"])
            if values["gec/credit/off_policy_token_count"] > 0:
                assert 0 < values["gec/credit/off_policy_prob_mean"] <= 1
        # edits happened only in all-wrong groups (the toy's six-digit chains start all wrong)
        assert sum(v["gec/count/answer"] + v["gec/count/solution"] + v["gec/count/reflect"] for v in steps.values())
        assert (job / "checkpoints" / "global_step_2" / "actor").is_dir()
        assert (job / ".hydra" / "overrides.yaml").read_text().count(f"algorithm.adv_estimator={estimator}") == 1

    out = tmp_path / "report"
    report = subprocess.run([sys.executable, "-m", "verl_ext.report", str(sweep_dir), "-o", str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    for name in ["training", "step_diagnostics", "gepo", "gec"]:
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC, name
    rows = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["0_toy_grpo", "1_toy_gepo"]
