"""End to end: one config and one seed give one run. Two short seeded runs of the embedded default (edge_grpo + GEC,
the `hf` rollout) write the same metrics.jsonl, timings aside; another seed writes a different one (issue 19 §2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import SMALL_RUN

pytestmark = pytest.mark.e2e

# wall-clock and memory measurements, never equal between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "agent_loop/", "time/")


# diagnostics that compare the rollout engine's float log-probs with the actor's: the hf server batches the requests
# that arrive together, and a batch's padding width changes the last bits of its log-probs (never its tokens)
ENGINE_FLOAT_PREFIXES = ("rollout_corr/", "training/rollout_")


def _measured(key: str) -> bool:
    return key.startswith(TIMING_PREFIXES) or "/perf/" in key or "memory" in key


def _run(tmp_path, name: str, seed: int) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    metrics = out / "metrics.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(metrics))
    env.pop("VERL_PLATFORM", None)
    args = [sys.executable, "-m", "verl_ext.main", "trainer.logger=[console,file]",
            f"trainer.file_logger_path={metrics}", f"trainer.default_local_dir={out / 'ckpt'}", *SMALL_RUN,
            "trainer.total_training_steps=3", f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}"]
    popen = subprocess.Popen(args, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        stdout, _ = popen.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        stdout, _ = popen.communicate()
        pytest.fail(f"run {name} did not finish in 900 s:\n{stdout[-4000:]}")
    assert popen.returncode == 0, stdout[-4000:]
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def _outcomes(records: list[dict]) -> list[dict]:
    return [{"step": r["step"], **{k: v for k, v in r["data"].items() if not _measured(k)}}
            for r in records]


def test_two_seeded_runs_write_the_same_metrics(tmp_path):
    a = _outcomes(_run(tmp_path, "a", seed=5))
    b = _outcomes(_run(tmp_path, "b", seed=5))
    assert [r["step"] for r in a] == [1, 2, 3]
    assert max(r["actor/grad_norm"] for r in a) > 0  # the runs trained (a run of zero-advantage steps proves less)
    for ra, rb in zip(a, b, strict=True):
        assert len(ra) > 50 and ra.keys() == rb.keys()  # the outcome metrics are compared, not only a few
        exact = {k for k in ra if not k.startswith(ENGINE_FLOAT_PREFIXES)}
        diff = {k: (ra[k], rb[k]) for k in exact if ra[k] != rb[k]}
        assert not diff, f"step {ra['step']}: {sorted(diff.items())[:20]}"
        for k in ra.keys() - exact:
            assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-6), (ra["step"], k, ra[k], rb[k])
    c = _outcomes(_run(tmp_path, "c", seed=6))
    assert any(ra.get("critic/score/mean") != rc.get("critic/score/mean") or
               ra.get("response_length/mean") != rc.get("response_length/mean") for ra, rc in zip(a, c))
