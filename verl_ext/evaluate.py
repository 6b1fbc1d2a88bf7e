"""Evaluate a model or checkpoint on the five suites the way EDGE-GRPO did, through verl's validation-only run.

    python -m verl_ext.evaluate --model Qwen/Qwen2.5-Math-7B --data data/eval --n-gpus 8
    python -m verl_ext.evaluate --model Qwen/Qwen2.5-Math-7B --checkpoint ckpts/global_step_1000 --data data/eval

The paper's settings (docs/edge-grpo.md) are the defaults: one sample per problem (``--n 1``) at temperature 0.1
(``--temperature``), top-p 1, at most 3000 new tokens (``--max-tokens``), prompts of at most 1096 tokens (vLLM's
``max_model_len`` 4096 in the original), the boxed-math reward (``verl_ext.rewards.math``). It runs

    python -m verl_ext.main --config-name verl_ext <the overrides below> <your overrides>

with ``trainer.val_only=true`` (verl's validation-only path: workers, rollout and reward loop as in training,
nothing trained), reads verl's per-suite validation metrics ``val-core/<suite>/acc/mean@<n>`` from verl's file
logger, and prints pass@1 per suite and the average over all problems weighted by suite size (the paper's
"Avg (1560)"; the original script printed the unweighted mean over suites, which is shown too) next to the
paper's table. ``--data`` is the folder written by ``python -m verl_ext.data.eval_suites``.

``--model`` is a Hugging Face model (a base model, or a checkpoint merged to HF format with
``python -m verl.model_merger``); ``--checkpoint`` is a verl ``global_step_N`` folder, loaded into ``--model``'s
architecture with ``trainer.resume_mode=resume_path``. Extra Hydra overrides go last and win (e.g.
``actor_rollout_ref.rollout.tensor_model_parallel_size=2``). Results go to ``--output`` (default
``eval_outputs/<name>/``): ``results.json``, verl's ``metrics.jsonl`` and the generations (``generations/``).
``--dry-run`` prints the command without running it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import Optional

from verl_ext.data.eval_suites import SUITE_BY_NAME, SUITES
from verl_ext.metrics_file import read_steps

# Pass@1 (%) after one epoch on DeepScaleR-Hard-1K (EDGE-GRPO paper, Table 1): model, method, the paper's Avg (1560),
# then AIME, AMC, MATH500, Minerva, OlympiadBench (the order of SUITES)
_PAPER_TABLE = (
    ("1.5B", "SFT", 29.17, (6.67, 28.92, 46.40, 12.87, 24.00)),
    ("1.5B", "Vanilla GRPO", 40.26, (10.00, 46.99, 65.00, 20.59, 30.37)),
    ("1.5B", "+Force-R", 41.55, (13.33, 31.33, 70.00, 22.06, 30.81)),
    ("1.5B", "+Force-R&EDA", 42.44, (10.00, 34.94, 69.60, 23.53, 32.30)),
    ("1.5B", "EDGE-GRPO", 47.24, (10.00, 44.58, 73.20, 29.04, 37.33)),
    ("7B", "SFT", 37.37, (3.33, 44.58, 68.00, 19.85, 22.37)),
    ("7B", "Vanilla GRPO", 47.69, (26.67, 53.01, 74.20, 25.74, 37.19)),
    ("7B", "+Force-R", 40.26, (13.33, 40.96, 67.60, 19.85, 29.33)),
    ("7B", "+Force-R&EDA", 45.19, (26.67, 50.60, 68.00, 28.68, 35.11)),
    ("7B", "EDGE-GRPO", 53.21, (16.67, 53.01, 79.00, 36.03, 42.67)),
)
PAPER_ROWS = tuple((size, method, avg, dict(zip([s.name for s in SUITES], cells)))
                   for size, method, avg, cells in _PAPER_TABLE)
PAPER_COUNTS = {s.name: s.paper_count for s in SUITES}
DEFAULT_REWARD = "pkg://verl_ext.rewards.math"
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"  # verl's FileLogger writes here when trainer.logger includes 'file'


# ---------------------------------------------------------------- pure parts (unit-tested)


def weighted_average(values: dict[str, float], counts: dict[str, int]) -> float:
    """Mean over problems: sum(value_s * count_s) / sum(count_s) over the suites in ``values``."""
    total = sum(counts[name] for name in values)
    if total <= 0:
        raise ValueError("no problems to average over")
    return sum(values[name] * counts[name] for name in values) / total


def suite_accuracies(metrics: dict[str, float], suites: list[str], n: int) -> dict[str, float]:
    """Per-suite accuracy from verl's validation metrics: ``val-core/<suite>/acc/mean@<n>``.

    Falls back to the highest ``mean@k`` of ``acc`` (then of ``reward`` / ``score``) when the exact key is absent
    (a reward without ``acc``); a suite with none of them is an error naming the keys that were there.
    """
    out = {}
    for name in suites:
        exact = f"val-core/{name}/acc/mean@{n}"
        if exact in metrics:
            out[name] = float(metrics[exact])
            continue
        found = None
        for var in ("acc", "reward", "score"):
            pattern = re.compile(rf"^val-(?:core|aux)/{re.escape(name)}/{var}/mean@(\d+)$")
            candidates = sorted((int(m.group(1)), k) for k in metrics if (m := pattern.match(k)))
            if candidates:
                found = candidates[-1][1]
                break
        if found is None:
            have = sorted(k for k in metrics if k.startswith(("val-core/", "val-aux/")))
            raise KeyError(f"no validation accuracy for suite {name!r} in verl's metrics (expected {exact}); "
                           f"validation keys present: {have[:20]}")
        out[name] = float(metrics[found])
    return out


def read_metrics_jsonl(path: str) -> dict[str, float]:
    """The metrics of the last step in verl's file-logger output that has val-core keys."""
    steps, _ = read_steps(path)
    with_val = [step for step, data in steps.items() if any(k.startswith("val-core/") for k in data)]
    return steps[max(with_val)] if with_val else {}


_CONSOLE_METRIC = re.compile(r"(val-(?:core|aux)/[\w@/.\-]+):(?:np\.float\d+\()?([-+0-9.eE]+|nan|inf)\)?")


def read_metrics_console(text: str) -> dict[str, float]:
    """verl's console logger lines (``step:N - key:value - ...``): the validation metrics, last value wins."""
    return {k: float(v) for k, v in _CONSOLE_METRIC.findall(text)}


def format_table(label: str, accuracies: dict[str, float], counts: dict[str, int],
                 paper_rows=PAPER_ROWS, model_size: Optional[str] = None) -> str:
    """Markdown table in percent: this run's row (weighted average over its problems) above the paper's rows.

    With all five suites the paper's rows show the published "Avg (1560)"; with fewer, the paper's rows are
    averaged over the same suites with the paper's suite sizes, so the columns compare like with like.
    """
    names = [s.name for s in SUITES if s.name in accuracies]
    n_total = sum(counts[name] for name in names)
    head = ["Model", "Method", f"Avg ({n_total})"] + [f"{SUITE_BY_NAME[name].title} ({counts[name]})" for name in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(model, method, values, cnts, avg=None):
        avg = weighted_average(values, cnts) if avg is None else avg
        cells = [model, method, f"{100 * avg:.2f}"] + [f"{100 * values[name]:.2f}" for name in names]
        return "| " + " | ".join(cells) + " |"

    lines.append(row(label, "this run", {name: accuracies[name] for name in names}, counts))
    all_suites = len(names) == len(SUITES)
    for size, method, paper_avg, values in paper_rows:
        if model_size and size != model_size:
            continue
        lines.append(row(f"paper {size}", method, {name: values[name] / 100 for name in names}, PAPER_COUNTS,
                         avg=paper_avg / 100 if all_suites else None))
    return "\n".join(lines)


# ---------------------------------------------------------------- the run


def find_suite_files(data_dir: str, suites: Optional[list[str]] = None) -> dict[str, str]:
    wanted = suites or [s.name for s in SUITES]
    unknown = [name for name in wanted if name not in SUITE_BY_NAME]
    if unknown:
        raise SystemExit(f"error: unknown suite(s) {unknown}; choose from {[s.name for s in SUITES]}")
    files = {name: os.path.join(data_dir, f"{name}.parquet") for name in wanted}
    missing = [path for path in files.values() if not os.path.isfile(path)]
    if suites and missing:
        raise SystemExit(f"error: missing {missing} (write them with python -m verl_ext.data.eval_suites)")
    files = {name: path for name, path in files.items() if os.path.isfile(path)}
    if not files:
        raise SystemExit(f"error: no <suite>.parquet in {data_dir} (python -m verl_ext.data.eval_suites writes them)")
    return files


def count_rows(files: dict[str, str]) -> dict[str, int]:
    """Problems per suite, counted by data_source in each suite's file (the weights of the average)."""
    import pandas as pd

    counts: dict[str, int] = {}
    for name, path in files.items():
        sources = pd.read_parquet(path, columns=["data_source"])["data_source"]
        if set(sources) != {name}:
            raise SystemExit(f"error: {path} holds data_source {sorted(set(sources))}, expected only {name!r}")
        counts[name] = int(len(sources))
    return counts


def build_overrides(args, files: dict[str, str], total_rows: int, output: str) -> list[str]:
    n_gpus = args.n_gpus * args.nnodes
    batch = n_gpus  # nothing is trained: the smallest batch verl's checks accept (one row per GPU)
    if total_rows < batch:  # verl's (unused) train loader would have no batch and stop the run
        raise SystemExit(f"error: {total_rows} problems for {n_gpus} GPUs; verl needs at least one per GPU")
    file_list = "[" + ",".join(os.path.abspath(p) for p in files.values()) + "]"
    ov = [
        f"actor_rollout_ref.model.path={args.model}",
        f"data.train_files={file_list}",  # verl builds a train loader even for val_only
        f"data.val_files={file_list}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.max_tokens}",
        "data.filter_overlong_prompts=false",  # every problem counts: an overlong prompt is an error, not a skip
        f"data.train_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={args.temperature}",
        f"actor_rollout_ref.rollout.val_kwargs.top_p={args.top_p}",
        f"actor_rollout_ref.rollout.val_kwargs.n={args.n}",
        "algorithm.gec.enable=false",
        f"reward.custom_reward_function.path={args.reward_path}",
        f"reward.custom_reward_function.name={args.reward_name}",
        "trainer.val_only=true",
        "trainer.val_before_train=true",
        "trainer.logger=[console,file]",
        f"trainer.file_logger_path={os.path.join(os.path.abspath(output), 'metrics.jsonl')}",  # verl_ext's runner
        f"trainer.n_gpus_per_node={args.n_gpus}",
        f"trainer.nnodes={args.nnodes}",
        "trainer.project_name=verl_ext_eval",
        f"trainer.experiment_name={os.path.basename(os.path.abspath(output))}",
        f"trainer.validation_data_dir={os.path.join(os.path.abspath(output), 'generations')}",
        f"trainer.default_local_dir={os.path.join(os.path.abspath(output), 'checkpoints')}",
        "trainer.save_freq=-1",
    ]
    ov.append(f"actor_rollout_ref.rollout.name={args.rollout}")
    if args.checkpoint:
        ov += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={os.path.abspath(args.checkpoint)}"]
    else:
        ov.append("trainer.resume_mode=disable")  # never pick up a checkpoint from default_local_dir by accident
    return ov + list(args.overrides)


def parse_args(argv: Optional[list[str]] = None):
    p = argparse.ArgumentParser(prog="python -m verl_ext.evaluate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF model path or name (the base model with --checkpoint)")
    p.add_argument("--checkpoint", help="a verl global_step_N folder to load into --model")
    p.add_argument("--data", required=True, help="folder of <suite>.parquet (python -m verl_ext.data.eval_suites)")
    p.add_argument("--suites", help="comma-separated subset of " + ",".join(s.name for s in SUITES))
    p.add_argument("--output", help="results folder (default eval_outputs/<model or checkpoint name>)")
    p.add_argument("--n", type=int, default=1, help="samples per problem (paper: 1)")
    p.add_argument("--temperature", type=float, default=0.1, help="paper: 0.1")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=3000, help="new tokens per answer (paper: 3000)")
    p.add_argument("--max-prompt-length", type=int, default=1096, help="paper: max_model_len 4096 - 3000")
    p.add_argument("--n-gpus", type=int, default=8, help="trainer.n_gpus_per_node")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--rollout", default="vllm", help="actor_rollout_ref.rollout.name: vllm (the paper's), sglang, "
                   "or hf (verl_ext's CPU backend, with --config-name toy_cpu)")
    p.add_argument("--config-name", default="verl_ext", help="verl_ext.main config (toy_cpu for the CPU demo)")
    p.add_argument("--reward-path", default=DEFAULT_REWARD)
    p.add_argument("--reward-name", default="compute_score")
    p.add_argument("--label", help="row label in the table (default: the model/checkpoint name)")
    p.add_argument("--paper-model", choices=["1.5B", "7B", "all", "none"], default="all",
                   help="which of the paper's rows to print next to this run")
    p.add_argument("--timeout", type=float, default=None, help="seconds before the run is stopped")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for verl_ext.main (they win)")
    args = p.parse_args(argv)
    if args.n < 1 or args.max_tokens < 1 or args.n_gpus < 1 or args.nnodes < 1:
        p.error("--n, --max-tokens, --n-gpus and --nnodes must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    name = os.path.basename(os.path.normpath(args.checkpoint or args.model))
    output = os.path.abspath(args.output or os.path.join("eval_outputs", f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"))
    files = find_suite_files(args.data, args.suites.split(",") if args.suites else None)
    counts = count_rows(files)
    cmd = [sys.executable, "-m", "verl_ext.main", "--config-name", args.config_name,
           *build_overrides(args, files, sum(counts.values()), output)]
    print("running: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if args.dry_run:
        return 0
    os.makedirs(output, exist_ok=True)
    metrics_path = os.path.join(output, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    env = dict(os.environ, **{FILE_LOGGER_ENV: metrics_path}, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    console = []
    timer = threading.Timer(args.timeout, proc.kill) if args.timeout else None
    if timer:
        timer.start()
    try:
        for line in proc.stdout:  # echo verl's output and keep its metric lines (fallback when no file metrics)
            sys.stdout.write(line)
            if "val-core/" in line or "val-aux/" in line:
                console.append(line)
        rc = proc.wait()
    finally:
        if timer:
            timer.cancel()
    if rc != 0:
        print(f"error: verl_ext.main exited with {rc}", file=sys.stderr)
        return rc or 1
    metrics = read_metrics_jsonl(metrics_path) if os.path.exists(metrics_path) else {}
    if not metrics:  # e.g. an existing Ray cluster whose driver-side env did not reach verl's logger
        metrics = read_metrics_console("".join(console))
    accuracies = suite_accuracies(metrics, list(files), args.n)
    failed = {name: metrics.get(f"val-aux/{name}/grader_failed/mean@{args.n}") for name in files}
    table = format_table(args.label or name, accuracies, counts,
                         paper_rows=() if args.paper_model == "none" else PAPER_ROWS,
                         model_size=None if args.paper_model in ("all", "none") else args.paper_model)
    result = {
        "model": args.model, "checkpoint": args.checkpoint, "suites": list(files), "counts": counts,
        "pass@1": accuracies, "weighted_average": weighted_average(accuracies, counts),
        "unweighted_mean_over_suites": sum(accuracies.values()) / len(accuracies),
        "grader_failed_fraction": failed,
        "settings": {"n": args.n, "temperature": args.temperature, "top_p": args.top_p,
                     "max_tokens": args.max_tokens, "max_prompt_length": args.max_prompt_length},
        "command": cmd, "table": table,
    }
    with open(os.path.join(output, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nPass@1 (%), {args.n} sample(s) per problem at T={args.temperature}, max {args.max_tokens} tokens:\n")
    print(table)
    print(f"\nweighted average over {sum(counts.values())} problems: {100 * result['weighted_average']:.2f}; "
          f"unweighted mean over suites (what the original script printed): "
          f"{100 * result['unweighted_mean_over_suites']:.2f}")
    if any(v for v in failed.values()):
        print("grader timeouts/failures (scored wrong): " + ", ".join(
            f"{k} {round(v * counts[k])}" for k, v in failed.items() if v))
    print(f"results: {os.path.join(output, 'results.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
