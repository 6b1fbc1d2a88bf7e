"""End-to-end: ``examples/toy/compare.sh`` at 2 steps -- two of its methods on the embedded CPU task, one seed,
then the by-method report (the full comparison is >= 3 seeds of full runs of all six: run by hand, docs/toy.md).

What it proves: the script's method overrides reach verl's real pipeline with the same seed (GEC off, and the paper's
method with the guard; every method's composed config is checked by the dry runs of
tests/unit/test_examples.py), validation reports the sampled and the greedy figure per data source, the step metrics
carry the all-wrong groups per data source, the report's by-method table and PNGs come out of the runs, and each run's
last checkpoint is measured per data source (``python -m verl_ext.toy --figures``). Two
short runs, ~3 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import SMALL_RUN, read_metrics

REPO = Path(__file__).resolve().parents[2]
# of compare.sh's methods (CI time): GEC off and GEC on with the guard; every method's composed config, the guard
# off in edge_grpo included, is checked by the dry runs of tests/unit/test_examples.py
METHODS = ("grpo", "edge_grpo_guard")
GEC_ON = ("edge_grpo_guard",)


@pytest.mark.e2e
def test_compare_script_runs_every_method_and_reports_by_method(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RUN_DIR", "DRY_RUN", "WANDB_API_KEY")}
    env.update(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), SEEDS="1", METHODS=" ".join(METHODS),
               STEPS="2", LAST="2", PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # validation at the last step on a random 64 of the held-out rows (the full set is ~20 s per validation)
    overrides = [o for o in SMALL_RUN
                 if not o.startswith(("trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq"))]
    overrides += ["trainer.test_freq=2", "data.val_max_samples=64", "trainer.save_freq=2"]
    proc = subprocess.run([str(REPO / "examples" / "toy" / "compare.sh"), *overrides], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]

    root = tmp_path / "out" / "verl_ext_toy"
    for method in METHODS:
        steps = read_metrics(root / f"toy_{method}_seed1" / "metrics.jsonl")
        assert sorted(steps) == [1, 2], method
        last = steps[2]
        assert any(f"verl_ext/{s}/groups_all_wrong_frac" in last for s in ("toy_chain", "toy_bag", "toy_chain5"))
        assert ("gec/acc_before" in last) == (method in GEC_ON), method
        assert ("gec/count/too_short" in last) == (method in GEC_ON), method
        assert any(k.startswith("val-core/") and "@greedy/acc/" in k for k in last), method  # greedy next to sampled
        # the last checkpoint measured per data source (verl's FSDP checkpoint loaded back as an HF model)
        figures = json.loads((root / f"toy_{method}_seed1" / "end_figures.json").read_text())
        assert set(figures) == {"toy_chain", "toy_bag", "toy_chain5"}, method
        assert all(f["n"] == 100 and 0 <= f["acc_t1"] <= 1 and f["median_len"] >= 1 for f in figures.values())
    table = (root / "compare" / "summary.md").read_text()
    by_method = table[table.index("| method"):].splitlines()
    assert [line.split("|")[1].strip() for line in by_method[2:2 + len(METHODS)]] == [f"toy_{m}" for m in METHODS]
    header = [c.strip() for c in by_method[0].strip("|").split("|")]
    assert "H resp" in header and "collapsed" in header and any(c.startswith("all-wrong toy_") for c in header)
    for name in ("training", "validation", "step_diagnostics"):
        assert (root / "compare" / f"{name}.png").stat().st_size > 5000
