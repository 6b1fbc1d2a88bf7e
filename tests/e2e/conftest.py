"""Helpers for the end-to-end tests: run the real entry points in a subprocess and read the metrics each step logged
through verl's own ``file`` logger (``metrics.jsonl``), not the console."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext.metrics_file import read_steps

# small and fast on 2 cores; the toy task's files come from the embedded default (hydra_configs/toy_cpu.yaml)
SMALL_RUN = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    # 8 samples per prompt: the warmed-up toy model is sure of many prompts, and with 4 a step whose groups all
    # share one reward (zero advantages, no update) came up often enough to make "every step trained" flaky
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.total_training_steps=2",
]


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} from a verl ``file`` logger JSONL (the validation before training is step 0)."""
    steps, bad = read_steps(path)
    assert bad == 0, f"{path}: {bad} lines are not file-logger records"
    return steps


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, metrics_path: Path | None = None):
        self.returncode = proc.returncode
        self.output = proc.stdout + proc.stderr
        self.lines = self.output.splitlines()
        # read now: a later run into the same folder must not change what this run logged
        self._metrics = read_metrics(metrics_path) if metrics_path and metrics_path.exists() else None

    def metrics(self) -> dict[int, dict[str, float]]:
        """{step: {metric: value}} of this run, from its ``metrics.jsonl``."""
        assert self._metrics is not None, f"the run wrote no metrics file:\n{self.tail()}"
        return {step: dict(values) for step, values in self._metrics.items()}

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])


def launch_main(workdir: Path, *overrides: str, metrics_name: str = "metrics.jsonl", timeout: int = 600) -> Run:
    """Run ``python -m verl_ext.main`` (embedded CPU default + ``SMALL_RUN`` + overrides) in ``workdir``, its metrics
    in ``workdir / metrics_name`` and its checkpoints in ``workdir / "ckpt"``; returns a ``Run`` (asserts rc 0)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # no VERL_PLATFORM: CPU mode must come from the toy config's trainer.device=cpu, as for a bare run
    env.pop("VERL_PLATFORM", None)
    metrics_path = workdir / metrics_name
    args = [sys.executable, "-m", "verl_ext.main", "trainer.logger=[console,file]",
            f"trainer.file_logger_path={metrics_path}",
            f"trainer.default_local_dir={workdir / 'ckpt'}", *SMALL_RUN, *overrides]
    # own process group (Ray's driver also leads one), so a run that hangs is killed with all it started
    popen = subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        stdout, stderr = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        stdout, stderr = popen.communicate()
        run = Run(subprocess.CompletedProcess(args, popen.returncode, stdout, stderr), metrics_path)
        pytest.fail(f"{' '.join(args)} did not finish in {timeout} s (killed):\n{run.tail()}")
    run = Run(subprocess.CompletedProcess(args, popen.returncode, stdout, stderr), metrics_path)
    assert run.returncode == 0, f"{' '.join(args)} failed:\n{run.tail()}"
    return run


@pytest.fixture
def run_main(tmp_path):
    """``launch_main`` in ``tmp_path``: ``run_main(*overrides, timeout=600)``; each run its own metrics file (a resumed
    run gets its own), the checkpoints shared (a resumed run finds them)."""
    calls = itertools.count(1)

    def _run(*overrides: str, timeout: int = 600) -> Run:
        return launch_main(tmp_path, *overrides, metrics_name=f"metrics.{next(calls)}.jsonl", timeout=timeout)

    return _run


def assert_shaped_training(steps: dict, expected_steps: list[int]) -> None:
    """Every step: finite losses, the methods' metrics, GEC ran. The run: the actor was updated (a step whose groups
    all share one reward has zero advantages and no update, which is legal) and some advantages were shaped."""
    assert sorted(steps) == expected_steps, steps.keys()
    for step, values in steps.items():
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(values[key]), (step, key, values[key])
        assert {"edge_grpo/factor_mean", "gepo/frac_pos_attenuated", "verl_ext/collapsed_group_frac"} <= set(values)
        # GEPO's thresholds: gepo/H_low, or gepo/<data source>/H_low with stats_scope=per_data_source
        assert any(k.startswith("gepo/") and k.endswith("/H_high") for k in values), sorted(values)
        # GEC edits only wrong responses and judges right/wrong by one rule before and after: accuracy cannot
        # fall (whatever the reward's scale; the reward itself can, e.g. a reflection that loses the format)
        assert values["gec/responses"] > 0 and values["gec/acc_after"] >= values["gec/acc_before"]
    assert max(v["actor/grad_norm"] for v in steps.values()) > 0
    assert max(v["verl_ext/frac_adv_modified"] for v in steps.values()) > 0


# fp32 on both sides (the hf rollout backend and the FSDP actor): rollout and actor log-probs agree to ~1e-6 on every
# token an engine sampled; an injected token read as sampled shows as ~1 (its rollout log-prob is 0.0)
SAMPLED_TOKEN_PROB_TOL = 1e-4


def assert_rollout_diagnostics_see_sampled_tokens(steps: dict, on_policy_steps: list[int],
                                                  tol: float = SAMPLED_TOKEN_PROB_TOL) -> None:
    """GEC on, its injected tokens in the response mask: verl's rollout-vs-actor diagnostics read 0 (up to ``tol``)
    at the steps whose rollouts came from the weights the actor scores with, and GEC's injected share of the trained
    tokens is logged."""
    for step in on_policy_steps:
        values = steps[step]
        assert values["training/rollout_probs_diff_valid"] == 1, step
        diff = {k: values[k] for k in ("training/rollout_probs_diff_max", "rollout_corr/kl")}
        assert diff["training/rollout_probs_diff_max"] < tol and abs(diff["rollout_corr/kl"]) < tol, (step, diff)
    for values in steps.values():
        assert 0 <= values["gec/injected_token_frac"] < 1
    assert max(v["gec/injected_token_frac"] for v in steps.values()) > 0
