"""End-to-end: ``python -m verl_ext.evaluate`` on CPU, the embedded toy model on five tiny fixture suites.

What it proves: the suites written by ``python -m verl_ext.data.eval_suites`` run through verl's validation-only
path (``python -m verl_ext.main ... trainer.val_only=true``), the per-suite pass@1 printed and saved are verl's
``val-core/<suite>/acc/mean@1`` read from verl's file logger, they agree with the per-sample generations verl
dumped (re-graded here), and the average is weighted by suite size. About a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SIZES = {"aime": 2, "amc": 3, "math500": 5, "minerva": 2, "olympiadbench": 4}


@pytest.mark.e2e
def test_evaluate_toy_model_on_five_suites(tmp_path):
    from verl_ext.toy import build_toy_assets
    from verl_ext.toy.reward import compute_score as toy_score
    from verl_ext.toy.task import all_pairs, prompt_text

    assets = build_toy_assets(verbose=False, task="add")  # the first toy task (its prompts and reward)
    one_digit, _ = all_pairs()  # sums the warmed-up toy model answers, so accuracies are not all zero
    pairs = iter(one_digit)
    suite_dir, data_dir = tmp_path / "raw", tmp_path / "eval"
    suite_dir.mkdir()
    problem_suite = {}
    args = []
    for name, n in SIZES.items():
        rows = []
        for _ in range(n):
            a, b = next(pairs)
            rows.append({"problem": prompt_text(a, b), "answer": str(a + b)})
            problem_suite[prompt_text(a, b)] = name
        path = suite_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        args += ["--suite", f"{name}={path}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    prep = subprocess.run([sys.executable, "-m", "verl_ext.data.eval_suites", *args, "--output", str(data_dir),
                           "--no-system-prompt"],  # the toy's chat has no system turn
                          capture_output=True, text=True, timeout=300, env=env)
    assert prep.returncode == 0, prep.stderr[-3000:]

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "verl_ext.evaluate", "--config-name", "toy_cpu", "--model", assets.model_path,
           "--data", str(data_dir), "--output", str(out), "--label", "toy", "--n-gpus", "1", "--rollout", "hf",
           "--max-tokens", "6", "--max-prompt-length", "32",
           "--reward-path", assets.reward_path, "--reward-name", assets.reward_name, "--timeout", "500"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]

    result = json.loads((out / "results.json").read_text())
    assert result["counts"] == SIZES and result["settings"]["temperature"] == 0.1 and result["settings"]["n"] == 1
    # the numbers are verl's own validation metrics
    logged = [json.loads(line)["data"] for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    metrics = [d for d in logged if any(k.startswith("val-core/") for k in d)][-1]
    for name in SIZES:
        assert result["pass@1"][name] == pytest.approx(metrics[f"val-core/{name}/acc/mean@1"])
    # ... and agree with the generations verl dumped, graded again here, suite by suite
    dumped = [json.loads(line) for line in (out / "generations" / "0.jsonl").read_text().splitlines() if line]
    assert len(dumped) == sum(SIZES.values())
    per_suite: dict[str, list[float]] = {}
    for sample in dumped:
        problem = next(p for p in problem_suite if p in sample["input"])
        regraded = toy_score(problem_suite[problem], sample["output"], sample["gts"])["acc"]
        assert regraded == sample["acc"]
        per_suite.setdefault(problem_suite[problem], []).append(regraded)
    for name, accs in per_suite.items():
        assert result["pass@1"][name] == pytest.approx(sum(accs) / len(accs))
    total = sum(SIZES.values())
    right = sum(sum(accs) for accs in per_suite.values())
    assert result["weighted_average"] == pytest.approx(right / total)
    assert right > 0  # the warmed-up toy model answers some one-digit sums at T=0.1
    # the printed table: this run's row, then the paper's
    table_row = next(line for line in run.stdout.splitlines() if line.startswith("| toy | this run |"))
    cells = [c.strip() for c in table_row.strip("|").split("|")]
    assert cells[2] == f"{100 * right / total:.2f}"
    assert cells[3:] == [f"{100 * result['pass@1'][name]:.2f}" for name in SIZES]
    assert "| paper 7B | EDGE-GRPO | 53.21 | 16.67 | 53.01 | 79.00 | 36.03 | 42.67 |" in run.stdout
    assert "trainer.val_only=true" in result["command"]
