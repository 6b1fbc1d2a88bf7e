"""End-to-end: ``examples/toy/compare.sh`` at 2 steps -- the four methods on the embedded CPU task, one seed, then
the by-method report (the full comparison is 150 steps x 2 seeds, ~70 min: run by hand, numbers in the README).

What it proves: every method's overrides reach verl's real pipeline with the same seed, validation reports the
sampled and the greedy figure per data source, the step metrics carry the all-wrong groups per data source, and the
report's by-method table and PNGs come out of the four runs. Four short runs, ~4 min on 2 cores.
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
METHODS = ("grpo", "edge_grpo", "eda", "gepo")


@pytest.mark.e2e
def test_compare_script_runs_every_method_and_reports_by_method(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RUN_DIR", "DRY_RUN", "WANDB_API_KEY")}
    env.update(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), METHODS=" ".join(METHODS), SEEDS="1",
               STEPS="2", LAST="2", PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # validation at the last step on a random 64 of the held-out rows (the full set is ~20 s per validation)
    overrides = [o for o in SMALL_RUN if not o.startswith(("trainer.total_training_steps", "trainer.test_freq"))]
    overrides += ["trainer.test_freq=2", "data.val_max_samples=64"]
    proc = subprocess.run([str(REPO / "examples" / "toy" / "compare.sh"), *overrides], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]

    root = tmp_path / "out" / "verl_ext_toy"
    for method in METHODS:
        records = [json.loads(line) for line in (root / f"toy_{method}_seed1" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [1, 2], method
        last = records[-1]["data"]
        assert "verl_ext/toy_add2/groups_all_wrong_frac" in last or "verl_ext/toy_add/groups_all_wrong_frac" in last
        assert ("gec/acc_before" in last) == (method == "edge_grpo"), method  # GEC on in edge_grpo only
        assert any(k.startswith("val-core/") and "@greedy/acc/" in k for k in last), method  # greedy next to sampled
    table = (root / "compare" / "summary.md").read_text()
    by_method = table[table.index("| method"):].splitlines()
    assert [line.split("|")[1].strip() for line in by_method[2:2 + len(METHODS)]] == [f"toy_{m}" for m in METHODS]
    header = [c.strip() for c in by_method[0].strip("|").split("|")]
    assert "H resp" in header and "collapsed" in header and any(c.startswith("all-wrong toy_add") for c in header)
    for name in ("training", "validation", "step_diagnostics"):
        assert (root / "compare" / f"{name}.png").stat().st_size > 5000
