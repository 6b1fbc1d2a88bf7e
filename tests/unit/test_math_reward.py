"""Boxed-math reward (verl_ext.rewards.math): grading, scales, bounded time from any thread, no leaked processes,
verl's own custom-reward loading, and GEC's agent loop scored with it on both scales."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from verl_ext.rewards import math as mr
from verl_ext.rewards.subprocess_pool import SubprocessPool, WorkerCrashed, WorkerTimeout

HANGS = "9^{9^{9^{9}}}"  # sympy evaluates the tower: minutes (measured > 20 s), math-verify's own timeout is off


def score(text, gt, **kw):
    return mr.compute_score("math500", text, gt, extra_info={"index": 0}, **kw)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


@pytest.fixture(scope="module")
def warm_pool():
    """The shared grader pool with one process started (startup is not part of the per-answer bound)."""
    assert score("\\boxed{2\\sqrt{7}}", "\\sqrt{28}")["acc"] == 1.0  # needs math-verify, not just string match
    return mr.grader_pool()


# ---------------------------------------------------------------- grading


@pytest.mark.parametrize("text,gt,acc", [
    ("so the answer is \\boxed{5}.", "5", 1.0),
    ("\\boxed{4} no wait \\boxed{5}", "5", 1.0),  # the last box is graded
    ("\\boxed{5} no wait \\boxed{4}", "5", 0.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", 1.0),
    ("\\boxed{1:36 \\text{ PM}}", "1:36", 1.0),  # MATH normalisation drops the unit
    ("\\boxed{2\\sqrt{7}}", "\\sqrt{28}", 1.0),  # math-verify (sympy)
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{010}", "10", 1.0),
    ("\\boxed{x=2}", "2", 1.0),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", 1.0),  # nested braces
    ("\\boxed{7}", "$7$", 1.0),  # $...$ around the ground truth
    ("\\boxed{7}", "\\boxed{7}", 1.0),  # boxed ground truth
    ("\\boxed{7}", ["6", "7"], 1.0),  # several accepted answers
    ("\\boxed{abc}", "5", 0.0),
    ("\\boxed{6}", 6, 1.0),  # numeric ground truth
])
def test_grading(text, gt, acc):
    r = score(text, gt)
    assert r["acc"] == acc and r["format"] == 1.0 and r["grader_failed"] == 0.0
    assert r["score"] == 1.0 + acc


@pytest.mark.parametrize("text", [
    "the answer is 5",  # no box
    "\\boxed{5",  # never closed
    "\\boxed{{5}",  # unbalanced
    "\\boxed{}",  # empty
    "\\boxed{   }",
    "",
    "\\boxed 5",  # not the brace form
])
def test_unformatted_is_wrong_on_both_scales(text):
    checked, original = score(text, "5"), score(text, "5", scale="original")
    assert checked == {"score": 0.0, "acc": 0.0, "format": 0.0, "grader_failed": 0.0}
    assert original == {"score": 1.0, "acc": 0.0, "format": 1.0, "grader_failed": 0.0}


def test_scales():
    right, wrong = "\\boxed{5}", "\\boxed{4}"
    assert score(right, "5") == {"score": 2.0, "acc": 1.0, "format": 1.0, "grader_failed": 0.0}
    assert score(wrong, "5") == {"score": 1.0, "acc": 0.0, "format": 1.0, "grader_failed": 0.0}
    assert score(right, "5", scale="original")["score"] == 2.0
    assert score(wrong, "5", scale="original")["score"] == 1.0
    for r in (score(right, "5"), score("nothing", "5", scale="original")):
        assert set(r) == {"score", "acc", "format", "grader_failed"} and all(type(v) is float for v in r.values())


@pytest.mark.parametrize("kwargs,key", [
    ({"scale": "paper"}, "scale"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"max_answer_chars": 0}, "max_answer_chars"),
    ({"grader_workers": 0}, "grader_workers"),
    ({"grader_memory_mb": -1}, "grader_memory_mb"),
])
def test_bad_options_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"reward\.custom_reward_function\.reward_kwargs\.{key}="):
        score("\\boxed{5}", "5", **kwargs)


def test_non_latex_and_garbage_answers_are_wrong_not_errors(warm_pool):
    for junk in ["!!@#%^&*", "\\frac{", "\\left( \\right", "}{", "\\begin{pmatrix}1&2", "é ∑ 🙂", "\x00\x01",
                 "\\sqrt{-1}^{\\infty}", "1/0", "\\\\\\\\"]:
        r = score(f"\\boxed{{{junk}}}", "5")
        assert r["acc"] == 0.0, junk
        assert r["score"] in (0.0, 1.0)


def test_huge_answers_are_bounded(warm_pool):
    big_box = "\\boxed{" + "1+" * 200_000 + "1}"
    t0 = time.monotonic()
    r = score("x" * 1_000_000 + big_box, "5")
    assert r == {"score": 1.0, "acc": 0.0, "format": 1.0, "grader_failed": 0.0}  # over max_answer_chars
    r = score("\\boxed{" * 50_000, "5")  # a million unclosed braces
    assert r["format"] == 0.0
    assert time.monotonic() - t0 < 10
    # just below the cap it is graded by math-verify, within the time bound
    r = score("\\boxed{" + "1+" * 400 + "1}", "401")  # 801 characters
    assert r["grader_failed"] == 0.0 and r["acc"] == 1.0


# ---------------------------------------------------------------- bounded time, from a non-main thread


def test_hanging_answer_from_a_thread_is_bounded_and_leaves_nothing(warm_pool):
    before = warm_pool.killed
    out = {}

    def grade():
        t0 = time.monotonic()
        out["r"] = score(f"\\boxed{{{HANGS}}}", "1", timeout_s=1.5)
        out["t"] = time.monotonic() - t0

    pids_before = {w.proc.pid for w in warm_pool._idle}
    th = threading.Thread(target=grade)
    th.start()
    th.join(60)
    assert not th.is_alive()
    assert out["r"] == {"score": 1.0, "acc": 0.0, "format": 1.0, "grader_failed": 1.0}
    assert 1.5 <= out["t"] < 1.5 + 5  # the bound, plus killing/reaping
    assert warm_pool.killed == before + 1
    for pid in pids_before - {w.proc.pid for w in warm_pool._idle}:
        assert not pid_alive(pid)  # killed and reaped, no zombie
    # the pool goes on grading (a fresh process replaces the killed one)
    assert score("\\boxed{2\\sqrt{7}}", "\\sqrt{28}")["acc"] == 1.0


def test_concurrent_threads_with_one_hang(warm_pool):
    answers = [("\\boxed{2\\sqrt{7}}", "\\sqrt{28}", 1.0), (f"\\boxed{{{HANGS}}}", "1", 0.0),
               ("\\boxed{\\frac{2}{4}}", "0.5", 1.0), ("\\boxed{3!}", "6", 1.0), ("\\boxed{y}", "x", 0.0)]
    results = [None] * len(answers)

    def grade(i):
        results[i] = score(answers[i][0], answers[i][1], timeout_s=2.0)

    threads = [threading.Thread(target=grade, args=(i,)) for i in range(len(answers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert [r["acc"] for r in results] == [a[2] for a in answers]
    assert [r["grader_failed"] for r in results] == [float(HANGS in a[0]) for a in answers]
    assert warm_pool.alive <= warm_pool.max_workers


# ---------------------------------------------------------------- the pool itself, with a fake worker

FAKE_WORKER = r'''
import json, os, sys, time
out = os.fdopen(os.dup(1), "w"); os.dup2(2, 1)
print(json.dumps({"ready": True}), file=out, flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["do"] == "sleep":
        time.sleep(3600)
    if req["do"] == "crash":
        os._exit(3)
    if req["do"] == "print":
        print("noise on stdout")
    print(json.dumps({"pid": os.getpid(), "echo": req.get("x")}), file=out, flush=True)
'''


@pytest.fixture
def fake_pool(tmp_path):
    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)
    pool = SubprocessPool([sys.executable, str(path)], max_workers=2, startup_timeout=60)
    yield pool
    pool.close()


def test_pool_kills_overrunning_worker(fake_pool):
    pid = fake_pool.request({"do": "echo", "x": 1}, timeout=30)["pid"]
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeout):
        fake_pool.request({"do": "sleep"}, timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert not pid_alive(pid) and fake_pool.killed == 1
    reply = fake_pool.request({"do": "echo", "x": 2}, timeout=30)
    assert reply["echo"] == 2 and reply["pid"] != pid and fake_pool.started == 2


def test_pool_crash_and_stdout_noise(fake_pool):
    assert fake_pool.request({"do": "print", "x": 3}, timeout=30)["echo"] == 3  # prints do not corrupt answers
    with pytest.raises(WorkerCrashed):
        fake_pool.request({"do": "crash"}, timeout=30)
    assert fake_pool.request({"do": "echo", "x": 4}, timeout=30)["echo"] == 4


def test_pool_threads_share_max_workers(fake_pool):
    pids, errors = [], []

    def call(do):
        try:
            pids.append(fake_pool.request({"do": do}, timeout=1.0)["pid"])
        except WorkerTimeout:
            errors.append(do)

    threads = [threading.Thread(target=call, args=(d,)) for d in ["sleep", "echo", "echo", "echo", "echo"]]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == ["sleep"] and len(pids) == 4
    assert fake_pool.started <= 3 and fake_pool.alive <= 2


def test_pool_close_stops_workers(tmp_path):
    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)
    pool = SubprocessPool([sys.executable, str(path)], max_workers=1)
    pid = pool.request({"do": "echo"}, timeout=30)["pid"]
    pool.close()
    assert wait_gone(pid, 5)


# ---------------------------------------------------------------- the real worker without its parent


def _start_worker():
    proc = subprocess.Popen([sys.executable, mr.WORKER_PATH, "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    return proc


def test_worker_hard_limit_kills_itself():
    """A request over hard_limit_s ends the worker even if nobody kills it (its parent is gone)."""
    proc = _start_worker()
    proc.stdin.write(json.dumps({"pred": HANGS, "gts": ["1"], "hard_limit_s": 1}).encode() + b"\n")
    proc.stdin.flush()
    try:
        assert proc.wait(timeout=30) != 0
    finally:
        proc.kill()
        proc.wait()


def test_worker_grades_and_exits_on_eof():
    proc = _start_worker()
    proc.stdin.write(json.dumps({"pred": "2\\sqrt{7}", "gts": ["3", "\\sqrt{28}"]}).encode() + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"correct": True}
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_orphaned_graders_exit():
    """A scoring process that dies (e.g. a Ray worker killed with SIGKILL) leaves no grader behind."""
    from verl_ext.rewards import subprocess_pool

    code = (  # loads the pool module by path: importing verl_ext would pull in torch (slow) for nothing
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('pool', {subprocess_pool.__file__!r})\n"
        "pool_mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(pool_mod)\n"
        f"pool = pool_mod.SubprocessPool([sys.executable, {mr.WORKER_PATH!r}, '0'], max_workers=1)\n"
        "assert pool.request({'pred': '2\\\\sqrt{7}', 'gts': ['\\\\sqrt{28}']}, timeout=60) == {'correct': True}\n"
        "print(*[w.proc.pid for w in pool._idle], flush=True)\n"
        "os._exit(0)\n"  # no atexit: the pool is not closed
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1 and wait_gone(pids[0], 10)


# ---------------------------------------------------------------- through verl's loader and GEC's agent loop


def test_loaded_by_verl_with_reward_kwargs():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://verl_ext.rewards.math", "name": "compute_score", "reward_kwargs": {"scale": "original"}}}})
    fn = get_custom_reward_fn(cfg)
    r = fn(data_source="aime", solution_str="no box", ground_truth="5", extra_info={})
    assert r == {"score": 1.0, "acc": 0.0, "format": 1.0, "grader_failed": 0.0}


@pytest.mark.parametrize("scale", ["checked", "original"])
def test_gec_agent_loop_with_this_reward(scale):
    """GEC edits exactly the wrong responses (acc 0) and leaves right ones, on both scales.

    GEC decides right/wrong from the reward's ``acc`` (not from ``score >= correct_threshold``): on the "checked"
    scale a boxed wrong answer scores 1 = the default threshold, and on the original scale every answer scores >= 1.
    """
    from tests.unit.test_gec import FakeServer, make_config, run_loop
    from verl_ext.toy.tokenizer import build_tokenizer

    tok = build_tokenizer()

    def config():
        c = make_config("pkg://verl_ext.rewards.math", p_reflect=0.0, p_answer=1.0, p_solution=0.0)
        c.reward.custom_reward_function.reward_kwargs = {"scale": scale}
        return c

    for first, wrong in [("The sum is \\boxed{5}", False), ("The sum is \\boxed{4}", True), ("It is 5", True)]:
        out = run_loop(tok, config(), FakeServer(tok, first=first))
        before = score(first, "5", scale=scale)
        assert out.extra_fields["gec_score_before"] == before["score"]
        assert out.extra_fields["gec_correct_before"] is (not wrong) and before["acc"] == float(not wrong)
        assert out.extra_fields["gec_branch"] == ("answer" if wrong else "none")
        final = score(tok.decode(out.response_ids, skip_special_tokens=True), "5", scale=scale)
        assert final["acc"] == 1.0  # the injected answer is graded right by the same reward
