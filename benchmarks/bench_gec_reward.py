"""Reward time per training step with GEC before and after it stopped scoring unedited responses twice, one run.

    python benchmarks/bench_gec_reward.py [--rows 128] [--fractions 0.2 0.5 0.8] [--repeats 5] [--quick] [--check]

GEC (``verl_ext/rollout/gec_agent_loop.py``) scores each training response's first attempt with verl's reward
manager inside the agent loop; verl's ``AgentLoopWorker._compute_score`` then scores the final response unless the
loop set ``reward_score``. Before the fix every response was scored twice; now (no reward model) an unedited
response keeps its first score and only edited ones (reflect / answer / solution) are scored again, on their final
text. Cases, with the boxed-math reward (``pkg://verl_ext.rewards.math``, ``scale=original``: MATH string check,
then math-verify in a pool of child processes) through verl's real reward manager (``load_reward_manager``,
``naive``, built by GEC's ``reward_manager_of``):

  (a) verl without GEC: verl's ``SingleTurnAgentLoop``, one ``run_single`` per response (verl's own path);
  (b) GEC before the fix: every response scored twice (the first attempt, then verl's score of the final text);
  (c) GEC after the fix: unedited responses once, edited ones twice.

The calls are the real code's, not a model of it. Per batch the benchmark runs the real agent loop with a fake
server that returns the row's response (and a reflection continuation), then verl's own
``AgentLoopWorker._agent_loop_postprocess`` / ``_compute_score`` / ``_postprocess`` with a reward-loop handle that
does what ``RewardLoopWorker.compute_score`` does without a reward model (``run_single`` of the same manager), and
records every ``run_single`` call with its row and input: ``GecAgentLoop`` as it is on every row (c), and on the
first ``--verify-rows`` rows also verl's ``SingleTurnAgentLoop`` (a) and ``GecAgentLoop`` with
``_first_score_is_final`` forced False, which is the code before the fix (b). It asserts the calls per row (c: 1
unedited, 2 edited, edited = exactly the wrong first answers under GEC's defaults; a: 1; b: 2), that (a)'s and
(b)'s recorded inputs are those derived from (c)'s ((a) its first scoring, (b) an unedited row's first scoring
twice), and that (b) and (c) give the same branches, ``rm_scores`` and reward columns. ``--check`` stops there.

Timing replays each case's calls for the whole batch: per row in order, all rows concurrently in one event loop (as
a reward-loop worker receives them; the manager runs the reward function in the loop's default thread pool), so
only reward time is measured (no agent loop, no generation). A row's first scoring goes to GEC's manager and its
final one to a second manager with its own math-verify processes (the reward-loop worker's side, a separate pool as
in a real run, where the two are different processes; one pool would let the repeat of an unedited answer hit
math-verify's warm caches); (a) scores on the reward-loop side only. Per fraction: one warm-up step, then
``--repeats`` rounds with the case order alternating (abc, cba, ...). Reported: the median wall time per step of
each case with its ratio to (a) (of the medians, and the median of the per-round ratios, steadier on a shared
machine), the CPU time per step (this process's threads + both sides' math-verify processes, from /proc, less
load-dependent), the scorings per step, and (c)/(b), what the fix saves. The same batch is replayed every round.

Batch: ``--rows`` math responses of 290-530 characters (chain-of-thought filler, inline LaTeX, a final
``\\boxed{}``) from 8 problem families with random numbers (fraction sums, surds, roots, points, expansions,
circle areas, binomials, intervals), a fraction ``f`` of them wrong, the rest right in several notations (some
settled by the string check, some only by math-verify: ``p/q`` for ``\\frac{p}{q}``, ``\\sqrt{k^2 m}`` for
``k\\sqrt{m}``, ``x = 3``), with ground truths and reference solutions. With GEC's defaults every wrong response is
edited (p 0.5 / 0.25 / 0.25 reflect / answer / solution, seeded), so the edit fraction is ``f``; reflection
continuations end right for 40% of the rows. ``--quick``: 48 rows, ``f`` = 0.5, 3 repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import logging
import os
import random
import statistics
import sys
import time
import types
from fractions import Fraction

import numpy as np
from omegaconf import OmegaConf

from verl_ext.names import TRAINING_ROLLOUT_KEY


def problem(rng: random.Random, family: int) -> tuple[str, str, list[str], list[str], str]:
    """(question, ground truth, right answers, wrong answers, one reasoning step), drawn from one of 8 families
    with random numbers, so the rows of a batch ask different things (math-verify's sympy caches stay cold)."""
    if family == 0:
        a, b, c, d = (rng.randint(1, 9) for _ in range(4))
        q = Fraction(a, b + 1) + Fraction(c, d + 1)
        p_, r = q.numerator, q.denominator
        gt = f"\\frac{{{p_}}}{{{r}}}" if r > 1 else str(p_)
        return (f"What is $\\frac{{{a}}}{{{b + 1}}}+\\frac{{{c}}}{{{d + 1}}}$?", gt,
                [gt, f"\\dfrac{{{p_}}}{{{r}}}", f"{p_}/{r}"], [f"\\frac{{{p_ + 1}}}{{{r}}}", f"\\frac{{{a + c}}}{{{b + d + 2}}}"],
                f"With the common denominator ${(b + 1) * (d + 1)}$ the two fractions add up.")
    if family == 1:
        k, m = rng.randint(2, 12), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
        gt = f"{k}\\sqrt{{{m}}}"
        return (f"Simplify $\\sqrt{{{k * k * m}}}$.", gt, [gt, f"{k} \\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}"],
                [f"{k + 1}\\sqrt{{{m}}}", f"{k}\\sqrt{{{m + 1}}}"], f"Since ${k * k * m} = {k}^2 \\cdot {m}$ we take ${k}$ out.")
    if family == 2:
        r1, r2 = rng.sample(range(-9, 15), 2)
        hi, lo = max(r1, r2), min(r1, r2)
        return (f"Find the larger root of $x^2 {-(r1 + r2):+d}x {r1 * r2:+d} = 0$.", str(hi), [str(hi), f"x = {hi}"],
                [str(lo), str(hi + 1)], f"Factoring gives $(x {-r1:+d})(x {-r2:+d}) = 0$.")
    if family == 3:
        c = rng.randint(1, 20)
        gt = f"({c},{2 * c})"
        return (f"Where does $y = 2x$ meet $y = x + {c}$?", gt, [f"({c}, {2 * c})", gt], [f"({2 * c},{c})", f"({c},{c})"],
                f"Setting $2x = x + {c}$ gives $x = {c}$.")
    if family == 4:
        k = rng.randint(2, 15)
        gt = f"x^2+{2 * k}x+{k * k}"
        return (f"Expand $(x+{k})^2$.", gt, [gt, f"x^2 + {2 * k}x + {k * k}", f"{k * k}+{2 * k}x+x^2"],
                [f"x^2+{k * k}", f"x^2+{k}x+{k * k}"], f"Using $(a+b)^2 = a^2 + 2ab + b^2$ with $b = {k}$.")
    if family == 5:
        r = rng.randint(3, 30)
        gt = f"{r * r}\\pi"
        return (f"What is the area of a circle of radius ${r}$?", gt, [gt, f"{r * r} \\pi", f"\\pi \\cdot {r * r}"],
                [f"{2 * r}\\pi", f"{r}\\pi"], f"The area is $\\pi r^2$ with $r = {r}$.")
    if family == 6:
        n = rng.randint(5, 60)
        gt = str(n * (n - 1) // 2)
        return (f"Compute $\\binom{{{n}}}{{2}}$.", gt, [gt, f"{gt}.0"], [str(n * (n - 1)), str(n * n // 2 + 1)],
                f"By definition $\\binom{{{n}}}{{2}} = \\frac{{{n} \\cdot {n - 1}}}{{2}}$.")
    k = rng.randint(2, 40)
    gt = f"(-{k},{k})"
    return (f"For which $x$ is $x^2 < {k * k}$?", gt, [f"(-{k}, {k})", gt], [f"[-{k},{k}]", f"(-{2 * k},{2 * k})"],
            f"The inequality $x^2 < {k * k}$ means $|x| < {k}$.")


FILLER = [
    "Let us first restate what the problem asks for.",
    "We keep track of every term so that nothing is lost when simplifying.",
    "It helps to write the expression in a cleaner form before computing.",
    "Checking the arithmetic once more, each step follows from the previous one.",
    "Now we simplify, collecting like terms carefully.",
    "A quick sanity check: the value should be reasonable for this kind of problem.",
    "We can double-check by substituting back into the original statement.",
    "Let me think about whether there is a simpler approach; the direct one works here.",
]
VERL_SIDE_MEMORY_MB = 4095  # grader_memory_mb of the reward-loop side's pool (the default is 4096)
REFLECT_RIGHT = 0.4  # share of rows whose reflection continuation ends with the right answer

SAMPLE_KEY = contextvars.ContextVar("bench_gec_sample", default=None)  # (case, row) of the running sample


def reasoning(rng: random.Random, step: str, answer: str) -> str:
    parts = rng.sample(FILLER, rng.randint(3, 5))
    parts.insert(rng.randint(1, len(parts)), step)
    return "To solve this, we work step by step. " + " ".join(parts) + f" Therefore the answer is $\\boxed{{{answer}}}$."


def make_rows(n: int, wrong_frac: float, seed: int) -> list[dict]:
    """``n`` rows: dataset kwargs as the agent loop receives them, the first response and the continuation."""
    rng = random.Random(seed)
    wrong = set(rng.sample(range(n), round(wrong_frac * n)))
    rows = []
    for i in range(n):
        question, gt, rights, wrongs, step = problem(rng, i % 8)
        first = reasoning(rng, step, rng.choice(wrongs if i in wrong else rights))
        again = rng.choice(rights) if rng.random() < REFLECT_RIGHT else rng.choice(wrongs)
        continuation = f" Let me redo the key step. {step} Recomputing gives $\\boxed{{{again}}}$."
        solution = f"{step} Simplifying, the result is $\\boxed{{{gt}}}$."
        kwargs = {
            "raw_prompt": [{"role": "user", "content": question}],
            "reward_model": {"ground_truth": gt, "style": "rule"},
            "extra_info": {"index": i, "solution": solution},
            "data_source": "math",
            "uid": f"u{i // 8}",
            "index": i,
            "priority": i,  # the legacy manager's per-row key: GEC's seeded branch draw
            TRAINING_ROLLOUT_KEY: True,
        }
        rows.append({"kwargs": kwargs, "first": first, "continuation": continuation, "wrong": i in wrong})
    return rows


def make_config():
    """A minimal verl config (as tests/unit/test_gec.py's make_config) with the boxed-math reward, GEC defaults."""
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 256, "response_length": 768, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "calculate_log_probs": True, "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1}}},
        "data": {},
        # the toy tokenizer is byte-level: one token per byte, several times a real model's count
        # GEC's defaults except: no prompt gate, and a continuation of at most 160 tokens (default 256), so that the
        # first generation's budget (768 - cue - 160) holds the longest first response of up to 528 bytes
        "algorithm": {"adv_estimator": "grpo",
                      "gec": {"enable": True, "prompt_length_gate": None, "max_continuation_tokens": 160}},
        "reward": {
            "custom_reward_function": {"path": "pkg://verl_ext.rewards.math", "name": "compute_score",
                                       "reward_kwargs": {"scale": "original"}},
            "reward_manager": {"source": "register", "name": "naive"},
            "reward_model": {"enable": False},
        },
    })


class FakeServer:
    """verl's LLMServerClient for one sample: first call -> the row's response, later calls -> its continuation."""

    def __init__(self, tok, first: str, continuation: str):
        self.tok, self.texts, self.calls = tok, (first, continuation), 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        text = self.texts[min(self.calls, 1)]
        self.calls += 1
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        if sampling_params.get("max_tokens") is not None:
            ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), routed_experts=None,
                           extra_fields={"global_steps": 1, "min_global_steps": 1, "max_global_steps": 1})


def fake_worker(config, tok, compute_score):
    """verl's AgentLoopWorker methods from _agent_loop_postprocess to _postprocess on a stand-in object."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    fake = types.SimpleNamespace(rollout_config=config.actor_rollout_ref.rollout, tokenizer=tok, processor=None,
                                 mm_processor_kwargs={}, distillation_enabled=False,
                                 reward_loop_worker_handles=[types.SimpleNamespace(
                                     compute_score=types.SimpleNamespace(remote=compute_score))])
    for name in ("_pad_token_ids", "_compute_multi_modal_inputs", "_compute_position_ids", "_compute_score",
                 "_compute_teacher_logprobs", "_get_mm_processor_kwargs", "_agent_loop_postprocess", "_postprocess"):
        setattr(fake, name, types.MethodType(getattr(AgentLoopWorker, name), fake))
    return fake


CASES = ("a verl, no GEC", "b GEC before fix", "c GEC after fix")


async def record(config, tok, rows, cases=CASES) -> dict:
    """Run the real paths of ``cases`` on every row; return per case the recorded run_single inputs per row, the
    rows' GEC branches and the postprocessed batch."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop, reward_manager_of

    class GecBeforeFix(GecAgentLoop):  # the code before the fix: reward_score left None on every row
        def _first_score_is_final(self) -> bool:
            return False

    manager = reward_manager_of(config, tok)
    if not hasattr(manager, "_bench_run_single"):
        manager._bench_run_single = manager.run_single
        calls: dict = {}
        manager._bench_calls = calls

        async def recording(data):
            key = SAMPLE_KEY.get()
            if key is None:
                raise RuntimeError("run_single outside a benchmarked sample")
            calls.setdefault(key, []).append(copy.deepcopy(data))
            return await manager._bench_run_single(data)

        manager.run_single = recording  # GEC's _score and the verl handle below both call this instance
    calls = manager._bench_calls
    calls.clear()

    async def compute_score(data):  # RewardLoopWorker.compute_score without a reward model
        return await reward_manager_of(config, tok).run_single(data)

    worker = fake_worker(config, tok, compute_score)
    classes = dict(zip(CASES, (SingleTurnAgentLoop, GecBeforeFix, GecAgentLoop)))
    result = {}
    for case in cases:
        cls = classes[case]
        async def one(i, row, cls=cls, case=case):
            SAMPLE_KEY.set((case, i))
            loop = cls(trainer_config=DictConfigWrap(config), server_manager=FakeServer(tok, row["first"],
                       row["continuation"]), tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
                       data_config=DictConfigWrap(config.data))
            out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                                  "logprobs": True}, **row["kwargs"])
            branch = out.extra_fields.get("gec_branch")
            return await worker._agent_loop_postprocess(out, False, **row["kwargs"]), branch

        done = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
        batch = worker._postprocess([d[0] for d in done])
        result[case] = {"calls": [calls.get((case, i), []) for i in range(len(rows))],
                        "branches": [d[1] for d in done], "batch": batch}
    return result


def derived(calls_c: list, edited: list[bool]) -> dict:
    """Each case's run_single inputs per row from GEC's (after the fix): (a) the first scoring, (b) the first
    scoring twice on an unedited row."""
    return {CASES[0]: [c[:1] for c in calls_c],
            CASES[1]: [c if e else [c[0], c[0]] for c, e in zip(calls_c, edited)],
            CASES[2]: calls_c}


def same_input(x, y) -> bool:
    return (x.batch["responses"].tolist() == y.batch["responses"].tolist()
            and x.batch["prompts"].tolist() == y.batch["prompts"].tolist()
            and x.non_tensor_batch["reward_model"][0] == y.non_tensor_batch["reward_model"][0])


def check(full, sub, rows) -> tuple[list[bool], list[str]]:
    """Assert what the cases stand for: on every row, GEC's (after the fix) run_single calls (1 unedited, 2 edited;
    edited = a wrong first answer); on the first rows, all three real paths (a 1, b 2, c 1 or 2 calls per row),
    the same inputs as derived from GEC's, the same branches and the same rewards before and after the fix.
    Returns which rows GEC edited and the problems found."""
    from verl_ext.rollout import gec

    problems = []
    c = full[CASES[2]]
    edited = [b in gec.EDIT_BRANCHES for b in c["branches"]]
    if edited != [r["wrong"] for r in rows]:
        bad = [i for i, (e, r) in enumerate(zip(edited, rows)) if e != r["wrong"]]
        problems.append(f"edited rows are not exactly the wrong first answers (rows {bad[:5]})")
    got = [len(x) for x in c["calls"]]
    bad = [i for i, (n, e) in enumerate(zip(got, edited)) if n != (2 if e else 1)]
    if bad:
        problems.append(f"{CASES[2]}: run_single calls per row {[got[i] for i in bad[:5]]} at rows {bad[:5]}")
    k = len(sub[CASES[2]]["branches"])
    want = derived(c["calls"][:k], edited[:k])
    for case in CASES:
        if case != CASES[0] and sub[case]["branches"] != c["branches"][:k]:
            problems.append(f"{case}: GEC's branches differ from the full batch's on the first rows")
        for i, (rec, der) in enumerate(zip(sub[case]["calls"], want[case])):
            if len(rec) != len(der) or not all(same_input(x, y) for x, y in zip(rec, der)):
                problems.append(f"{case}: row {i}: {len(rec)} run_single calls, not the {len(der)} assumed "
                                "(or other inputs)")
                break
    before, after = (sub[case]["batch"] for case in CASES[1:])
    if not np.array_equal(before.batch["rm_scores"].sum(-1).numpy(), after.batch["rm_scores"].sum(-1).numpy()):
        problems.append("rm_scores differ before/after the fix")
    for key in ("acc", "format", "grader_failed"):
        if key not in after.non_tensor_batch or list(before.non_tensor_batch[key]) != list(after.non_tensor_batch[key]):
            problems.append(f"reward column {key!r} differs before/after the fix (or is missing)")
    return edited, problems


def grader_cpu() -> dict[int, float]:
    """CPU seconds so far of each live math-verify process of both sides' pools (Linux /proc)."""
    from verl_ext.rewards import math as reward

    pids = []
    for memory_mb in (reward.DEFAULT_GRADER_MEMORY_MB, VERL_SIDE_MEMORY_MB):
        pool = reward.grader_pool(reward.DEFAULT_GRADER_WORKERS, memory_mb)
        with pool._lock:
            pids += [w.proc.pid for w in (*pool._idle, *pool._busy)]
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return out


async def replay(calls_per_row) -> tuple[float, float, int]:
    """Wall time and CPU time (this process's threads + the math-verify processes) of the recorded run_single
    calls ``(run_single, input)``, each row's in order, all rows concurrently; and how many the grader failed
    (timeouts: too loaded)."""
    async def row(calls):
        return [await run_single(data) for run_single, data in calls]

    cpu0, workers0 = time.process_time(), grader_cpu()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(row(c) for c in calls_per_row))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + sum(t - workers0.get(pid, 0.0) for pid, t in grader_cpu().items())
    return wall, cpu, sum(int(r["reward_extra_info"].get("grader_failed", 0) > 0) for rs in results for r in rs)


async def bench(args) -> int:
    from verl_ext.rollout.gec_agent_loop import reward_manager_of
    from verl_ext.toy.tokenizer import build_tokenizer

    logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").setLevel(logging.ERROR)  # once per sample
    tok, config = build_tokenizer(), make_config()
    manager = reward_manager_of(config, tok)
    # the reward-loop worker's side: the same reward, its own pool of math-verify processes (the pool key differs
    # by the memory cap, 1 MiB below the default), as in a real run where it is another process
    verl_config = copy.deepcopy(config)
    verl_config.reward.custom_reward_function.reward_kwargs.grader_memory_mb = VERL_SIDE_MEMORY_MB
    verl_manager = reward_manager_of(verl_config, tok)
    failed = False
    print(f"{args.rows} rows per step, median of {args.repeats} rounds (case order alternating), "
          "boxed-math reward through verl's naive reward manager")
    for frac in args.fractions:
        rows = make_rows(args.rows, frac, seed=int(1000 * frac))
        t0 = time.perf_counter()
        full = await record(config, tok, rows, CASES[2:])
        sub = await record(config, tok, rows[: args.verify_rows])
        edited, problems = check(full, sub, rows)
        calls = derived(full[CASES[2]]["calls"], edited)
        counts = {c: sum(len(x) for x in calls[c]) for c in CASES}
        branches = full[CASES[2]]["branches"]
        branches = {b: branches.count(b) for b in sorted(set(branches))}
        print(f"\nedit fraction {frac:.2f} (edited {sum(edited)}/{len(rows)}: {branches}); real code run in "
              f"{time.perf_counter() - t0:.1f} s; run_single calls per step: "
              + ", ".join(f"{c[0]} {n}" for c, n in counts.items()))
        if problems:
            failed = True
            print("  MISMATCH: " + "; ".join(problems))
            continue
        print(f"  as assumed: GEC's calls per row on all rows (1 unedited, 2 edited), all three paths on the first "
              f"{args.verify_rows} (a 1, b 2), same inputs, same rewards before/after the fix")
        if args.check:
            continue
        # a row's first scoring by GEC's manager (the agent-loop worker's), its final one by the reward-loop
        # worker's, each with its own math-verify processes; verl without GEC (a) scores in the reward loop only
        gec_side, verl_side = manager._bench_run_single, verl_manager.run_single

        def fresh(case, rows=None, calls=calls, gec_side=gec_side, verl_side=verl_side):
            """The case's calls with fresh copies of their inputs (run_single mutates extra_info), untimed."""
            sides = (verl_side,) if case == CASES[0] else (gec_side, verl_side)
            return [[(sides[j], copy.deepcopy(d)) for j, d in enumerate(c)] for c in calls[case][:rows]]

        await replay(fresh(CASES[1], rows=32))  # warm-up: both sides' grader processes, the thread pool
        times = {c: [] for c in CASES}
        cpus = {c: [] for c in CASES}
        grader_failed = 0
        for r in range(args.repeats):
            for case in (CASES if r % 2 == 0 else CASES[::-1]):
                inputs = fresh(case)
                wall, cpu, failures = await replay(inputs)
                times[case].append(wall)
                cpus[case].append(cpu)
                grader_failed += failures
        med = {c: statistics.median(t) for c, t in times.items()}
        per_round = {c: statistics.median(x / y for x, y in zip(times[c], times[CASES[0]])) for c in CASES}
        cpu = {c: statistics.median(t) for c, t in cpus.items()}
        for c in CASES:
            print(f"  {c:18s} {1e3 * med[c]:7.0f} ms/step  x{med[c] / med[CASES[0]]:.2f} of (a) (per-round "
                  f"x{per_round[c]:.2f})  CPU {1e3 * cpu[c]:6.0f} ms x{cpu[c] / cpu[CASES[0]]:.2f}  "
                  f"{counts[c]:4d} scorings, {1e3 * med[c] / counts[c]:5.2f} ms each")
        saved = statistics.median(x / y for x, y in zip(times[CASES[2]], times[CASES[1]]))
        print(f"  (c)/(b): wall x{med[CASES[2]] / med[CASES[1]]:.2f} (per-round x{saved:.2f}), CPU "
              f"x{cpu[CASES[2]] / cpu[CASES[1]]:.2f}, scorings x{counts[CASES[2]] / counts[CASES[1]]:.2f}")
        print("  rounds (ms): " + "; ".join(f"{c[0]} " + " ".join(f"{1e3 * t:.0f}" for t in times[c]) for c in CASES)
              + f"; grader timeouts while timing: {grader_failed}")
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--fractions", type=float, nargs="+", default=[0.2, 0.5, 0.8])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--verify-rows", type=int, default=32, help="rows on which all three real paths are run")
    p.add_argument("--quick", action="store_true", help="48 rows, edit fraction 0.5, 3 repeats, 16 verified rows")
    p.add_argument("--check", action="store_true", help="only the recorded counts and rewards, no timing")
    args = p.parse_args()
    if args.quick:
        args.rows, args.fractions, args.repeats, args.verify_rows = 48, [0.5], 3, 16
    sys.exit(asyncio.run(bench(args)))


if __name__ == "__main__":
    main()
