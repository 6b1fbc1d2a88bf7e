"""End-to-end: ``examples/toy/compare.sh`` at 2 steps -- two of its methods on the embedded CPU task, one seed,
then the by-method report (the full comparison is >= 3 seeds of full runs: run by hand, docs/toy.md).

What it proves: the script's method overrides reach verl's real pipeline with the same seed (the hint mode's GHPO
scope, and the paper's method with the guard; every method's composed config, GEC off included, is checked by the dry
runs of tests/unit/test_examples.py), validation reports the sampled and the greedy figure per data source, the step
metrics carry the all-wrong groups per data source, the report's by-method table and PNGs come out of the runs, and
each run's last checkpoint is measured per data source (``python -m verl_ext.toy --figures``).

The round runs on the hard split with the prompt room a hint needs, on the legacy trainer (CI time: v1's TransferQueue
adds ~80 s a run here; compare.sh passes the trainer through like any override), so its ``grpo_hint_all`` run also
carries the hint mode's end-to-end claims on that trainer with scope ``all`` (v1 with scope ``one``:
tests/e2e/test_hints.py): all-wrong groups get hinted samples from the lowest level up, every member of a hinted
group is replaced, a hinted row is the policy's own sampling (verl's rollout-vs-actor diagnostics read 0, no token
is GEC's), and validation is never hinted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import SAMPLED_TOKEN_PROB_TOL, SMALL_RUN, read_metrics

REPO = Path(__file__).resolve().parents[2]
# of compare.sh's methods (CI time): the hint mode (GHPO's scope) and GEC on with the guard; every method's composed
# config is checked by the dry runs of tests/unit/test_examples.py
METHODS = ("grpo_hint_all", "edge_grpo_guard")
HINTED = ("grpo_hint_all",)
# the hard split (its groups start all wrong: hints and GEC's edits every step) with a hint's prompt room
# (docs/hints.md), on the legacy trainer
ROUND = ["+toy.train_sources=[toy_chain5]", "data.max_prompt_length=64", "trainer.use_v1=false"]
N = 8  # rollout.n of SMALL_RUN


@pytest.mark.e2e
def test_compare_script_runs_every_method_and_reports_by_method(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RUN_DIR", "DRY_RUN", "WANDB_API_KEY")}
    env.update(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), SEEDS="1", METHODS=" ".join(METHODS),
               STEPS="2", LAST="2", PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # validation at the last step on a random 64 of the held-out rows (the full set is ~20 s per validation)
    overrides = [o for o in SMALL_RUN
                 if not o.startswith(("trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq"))]
    overrides += ["trainer.test_freq=2", "data.val_max_samples=64", "trainer.save_freq=2", *ROUND]
    proc = subprocess.run([str(REPO / "examples" / "toy" / "compare.sh"), *overrides], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]

    root = tmp_path / "out" / "verl_ext_toy"
    for method in METHODS:
        steps = read_metrics(root / f"toy_{method}_seed1" / "metrics.jsonl")
        assert sorted(steps) == [1, 2], method
        last = steps[2]
        assert any(f"verl_ext/{s}/groups_all_wrong_frac" in last for s in ("toy_chain", "toy_bag", "toy_chain5"))
        assert ("hint/groups_hinted" in last) == (method in HINTED), method
        if method in HINTED:
            hinted_every_member(steps)
        else:
            assert "gec/count/too_short" in last and last["gec/responses"] > 0, method  # GEC ran with its guard
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


def hinted_every_member(steps: dict) -> None:
    """Scope ``all`` on the hard split: hinted groups, each member replaced, hinted rows sampled by the policy."""
    assert sum(values["hint/groups_hinted"] for values in steps.values()) > 0  # the hard split starts all wrong
    for step, values in steps.items():
        hinted = values["hint/groups_hinted"]
        assert values["hint/level0/samples"] >= hinted  # every hinted group starts at the lowest level
        assert values["hint/skipped/prompt_too_long"] == 0 and values["hint/skipped/no_solution"] == 0
        assert values["hint/replaced"] == N * hinted, (step, values)
        # hinted rows are sampled rows: nothing injected, the rollout's log-probs are the actor's
        assert values["gec/injected_token_frac"] == 0
        assert values["training/rollout_probs_diff_max"] < SAMPLED_TOKEN_PROB_TOL
        assert math.isfinite(values["actor/pg_loss"]) and math.isfinite(values["actor/grad_norm"])
