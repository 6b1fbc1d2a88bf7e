"""The official EDGE-GRPO trainer on the toy: check the checkout, build the side venv, export the toy, train, measure.

Optional tooling, outside the package and outside CI (docs/official-edge-grpo.md). It needs a local checkout of
github.com/ZhangXJ199/EDGE-GRPO at commit ``cbe13ca`` and never copies its code into this repository: ``train``
extracts the checkout's ``trl_edge`` at that commit into the run's work folder and applies ``toy_task.patch``
(the toy's six task literals, read from environment variables; no line of the official logic changes). The
diagnostic ``train --masked-entropy`` also applies ``masked_entropy.patch``: one line, EDA's H_i over each response's
own tokens.

Run with this project's Python (verl_ext importable), from anywhere::

    python benchmarks/official_edge_grpo/harness.py check  --official CHECKOUT
    python benchmarks/official_edge_grpo/harness.py venv   --official CHECKOUT --venv VENV
    python benchmarks/official_edge_grpo/harness.py export --out EXPORT
    python benchmarks/official_edge_grpo/harness.py train  --official CHECKOUT --venv VENV --export EXPORT \\
        --out RUN --method edge_grpo --seed 1 --lr 2e-5 [--temperature 1.0] [--max-steps N] [--masked-entropy]
    python benchmarks/official_edge_grpo/harness.py figures --run RUN

``train`` ends with ``figures``: the toy's held-out evaluation (``verl_ext.toy.build.reason_step0_figures``, what
``python -m verl_ext.toy --figures`` measures on a verl checkpoint) on the saved HF model, into
``RUN/end_figures.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OFFICIAL_COMMIT = "cbe13ca"
OFFICIAL_URL = "https://github.com/ZhangXJ199/EDGE-GRPO"
PATCH = HERE / "toy_task.patch"
# A diagnostic, never part of an official run: EDA's H_i as the mean over each response's own tokens (verl_ext's
# choice) instead of the official unmasked mean over the step's padded width; one line of the official logic changes
MASKED_ENTROPY_PATCH = HERE / "masked_entropy.patch"
TRAINER = "trl_edge/trainer/grpo_aha_trainer.py"

# The side venv. The official requirements.txt pins torch 2.5.1, torchaudio 2.5.1, torchvision 0.20.1,
# transformers 4.52.4, tokenizers 0.21.1, trl 0.19.0, deepspeed 0.16.7, vllm 0.7.2, numpy 1.26.4, math-verify 0.7.0,
# fire 0.7.1, pylatexenc, tensorboard. What moves, and why, is in PIN_CHANGES.
VENV_STEPS = (
    ("torch==2.13.0",),  # first: the CPU build this project uses (from /opt/wheels or the CPU index)
    ("transformers==4.52.4", "accelerate", "datasets", "math-verify", "pandas", "pyarrow"),
    ("--no-deps", "trl==0.19.0"),  # trl_edge.mergekit_utils imports trl.import_utils; nothing else of trl runs
)
PIN_CHANGES = {
    "torch==2.5.1": "-> 2.13.0 CPU build: PyPI's 2.5.1 is the CUDA build; the trainer makes no CUDA-only call",
    "torchvision==0.20.1, torchaudio==2.5.1": "dropped: never imported on the trainer's path",
    "deepspeed==0.16.7": "dropped: ZeRO-3 launch config only (one CPU process here)",
    "vllm==0.7.2": "dropped: use_vllm is off; the trainer generates with HF generate",
    "trl==0.19.0": "kept, installed without its dependencies: trl_edge imports only trl.import_utils from it",
    "fire, pylatexenc, tensorboard": "dropped: CLI, a math-grader extra and a logger this path does not use",
    "numpy==1.26.4, tokenizers==0.21.1, math-verify==0.7.0": "unpinned: resolved with the rest (transformers "
    "4.52.4 bounds tokenizers to 0.21.x; the toy's reward replaces the math grader)",
    "accelerate, datasets, pandas, pyarrow": "added unpinned: TRL's runtime and the parquet export",
}
# The six task values of the patch (official default -> the toy's): the toy config's lengths (a first attempt of
# 64 - (1 + 30) = 33 tokens, a continuation of 30), its cue and answer template; the full reward stays 2 (toy
# accuracy + a constant format reward of 1) and the prompt gate stays 256 (toy prompts are under 32 tokens).
TASK_ENV = {
    "EDGE_TASK_FIRST_MAX_NEW_TOKENS": "33",
    "EDGE_TASK_CONTINUATION_MAX_NEW_TOKENS": "30",
    "EDGE_TASK_FULL_REWARD": "2",
    "EDGE_TASK_PROMPT_GATE": "256",
    "EDGE_TASK_CUE": "!",
    "EDGE_TASK_ANSWER_TEMPLATE": "!#{answer}",
}


def die(msg: str) -> None:
    raise SystemExit(f"official_edge_grpo: {msg}")


def check_checkout(official: str | os.PathLike) -> Path:
    """The checkout's path, after checking it is a git checkout of the official repository at OFFICIAL_COMMIT
    whose trainer the patch applies to; a clear stop otherwise."""
    root = Path(official).expanduser().resolve()
    fix = (f"clone it: git clone {OFFICIAL_URL} {root} && git -C {root} checkout {OFFICIAL_COMMIT}")
    if not root.is_dir():
        die(f"no checkout of the official repository at {root}; {fix}")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        die(f"{root} is not a git checkout ({head.stderr.strip()}); {fix}")
    want = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{OFFICIAL_COMMIT}^{{commit}}"],
                          capture_output=True, text=True)
    if want.returncode != 0:
        die(f"{root} does not hold commit {OFFICIAL_COMMIT} (is it {OFFICIAL_URL}?); {fix}")
    if head.stdout.strip() != want.stdout.strip():
        die(f"{root} is at {head.stdout.strip()[:12]}, not {OFFICIAL_COMMIT}: "
            f"git -C {root} checkout {OFFICIAL_COMMIT}")
    if not (root / TRAINER).is_file():
        die(f"{root / TRAINER} is missing: not the official EDGE-GRPO repository?")
    return root


def patched_copy(official: Path, work: Path, masked_entropy: bool = False) -> Path:
    """``trl_edge`` at OFFICIAL_COMMIT, extracted into ``work/official`` with toy_task.patch applied (and, for the
    masked-entropy diagnostic, masked_entropy.patch)."""
    dest = work / "official"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(official), "archive", OFFICIAL_COMMIT, "trl_edge"],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for patch in (PATCH, MASKED_ENTROPY_PATCH) if masked_entropy else (PATCH,):
        applied = subprocess.run(["patch", "-p1", "--forward", "-i", str(patch)], cwd=dest, capture_output=True,
                                 text=True)
        if applied.returncode != 0:
            die(f"{patch.name} does not apply to {official} at {OFFICIAL_COMMIT}:\n{applied.stdout}{applied.stderr}")
    return dest


def build_venv(venv: Path) -> None:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for step in VENV_STEPS:
        subprocess.run([str(py), "-m", "pip", "install", "-q", *step], check=True)
    for pin, why in PIN_CHANGES.items():
        print(f"  {pin}: {why}")
    check_venv(venv)


def check_venv(venv: Path) -> None:
    py = venv / "bin" / "python"
    if not py.exists():
        die(f"no side venv at {venv}: python {Path(__file__).name} venv --official CHECKOUT --venv {venv}")
    probe = subprocess.run([str(py), "-c", "import torch, transformers; print(torch.__version__, "
                            "transformers.__version__, torch.cuda.is_available())"], capture_output=True, text=True)
    if probe.returncode != 0 or " 4.52.4 " not in f" {probe.stdout} ":
        die(f"{venv} is not the side venv (transformers 4.52.4): {probe.stdout}{probe.stderr}")
    print(f"side venv {venv}: torch, transformers, CUDA = {probe.stdout.strip()}")


def export_toy(out: Path) -> dict:
    """The toy's packaged weights and tokenizer as an HF model directory (pad = EOS, as in the paper's Qwen setup:
    the official re-tokenisation drops every EOS and the first pad then stands in for it), and its hard split's
    parquets in the official format (``problem`` / ``answer`` / ``solution``)."""
    import pandas as pd

    from verl_ext.toy.build import build_toy_assets

    assets = build_toy_assets(train_sources=("toy_chain5",), verbose=False)
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(assets.model_path, model)
    for name in ("tokenizer_config.json", "generation_config.json"):
        path = model / name
        cfg = json.loads(path.read_text())
        if name == "tokenizer_config.json":
            cfg["pad_token"] = cfg["eos_token"]
        else:
            cfg["pad_token_id"] = cfg.get("eos_token_id")
        path.write_text(json.dumps(cfg, indent=2))
    counts = {}
    for split, src in (("train", assets.train_parquet), ("val", assets.val_parquet)):
        df = pd.read_parquet(src)
        if split == "val":  # the hard split's held-out prompts, once each
            df = df[df["data_source"] == "toy_chain5"]
        rows = pd.DataFrame({
            "problem": [p[-1]["content"] for p in df["prompt"]],
            "answer": [str(r["ground_truth"]) for r in df["reward_model"]],
            "solution": [e["solution"] for e in df["extra_info"]],
        })
        if split == "val":
            rows = rows.drop_duplicates(subset=["problem"]).reset_index(drop=True)
        rows.to_parquet(out / f"{split}.parquet")
        counts[split] = len(rows)
    meta = {"toy_root": assets.root, "fingerprint": assets.stats.get("fingerprint"), "rows": counts,
            "reward_path": str(Path(assets.reward_path).resolve())}
    (out / "export.json").write_text(json.dumps(meta, indent=1))
    print(f"exported the toy to {out}: {counts}")
    return meta


def train(args) -> None:
    official = check_checkout(args.official)
    venv = Path(args.venv).resolve()
    check_venv(venv)
    export = Path(args.export).resolve()
    if not (export / "export.json").is_file():
        die(f"no export at {export}: python {Path(__file__).name} export --out {export}")
    meta = json.loads((export / "export.json").read_text())
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    code = patched_copy(official, out, masked_entropy=args.masked_entropy)
    env = {**os.environ, **TASK_ENV, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [str(venv / "bin" / "python"), str(HERE / "official_train.py"), "--model", str(export / "model"),
           "--train", str(export / "train.parquet"), "--reward-path", meta["reward_path"], "--out", str(out),
           "--method", args.method, "--seed", str(args.seed), "--lr", str(args.lr),
           "--temperature", str(args.temperature), "--max-steps", str(args.max_steps), "--threads", str(args.threads),
           "--save-steps", str(args.save_steps)]
    with open(out / "train.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        die(f"the official trainer failed (exit {done.returncode}); see {out / 'train.log'}")
    figures(out)


def ours_one_step(dump_dir: Path, seed: int, temperature: float, mode: str = "gec") -> Path:
    """One verl_ext ``edge_grpo`` step (EDA in the official gradient mode) on the hard split, one prompt x 8, with
    verl's rollout dump on: the recording the differential replays."""
    run = dump_dir / "ours_run"
    cmd = [sys.executable, "-m", "verl_ext.main", "--config-name", "toy_cpu", "+toy.train_sources=[toy_chain5]",
           "algorithm.adv_estimator=edge_grpo", "algorithm.gec.enable=true", f"algorithm.gec.mode={mode}",
           "algorithm.edge_grpo.entropy_grad=true", "data.train_batch_size=1",
           "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", f"data.seed={seed}",
           f"actor_rollout_ref.rollout.seed={seed}", f"actor_rollout_ref.rollout.temperature={temperature}",
           "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
           "trainer.save_freq=-1", "trainer.logger=[console]", f"trainer.default_local_dir={run}/checkpoints",
           f"trainer.rollout_data_dir={dump_dir / 'dump'}", f"hydra.run.dir={run}/hydra"]
    with open(dump_dir / "ours_step.log", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    dump = dump_dir / "dump" / "1.jsonl"
    if done.returncode != 0 or not dump.is_file():
        die(f"the verl_ext step failed (exit {done.returncode}); see {dump_dir / 'ours_step.log'}")
    return dump


def differential(args) -> None:
    official = check_checkout(args.official)
    venv = Path(args.venv).resolve()
    check_venv(venv)
    export = Path(args.export).resolve()
    meta = json.loads((export / "export.json").read_text())
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dump = Path(args.dump).resolve() if args.dump else ours_one_step(out, args.seed, args.temperature, args.mode)
    code = patched_copy(official, out)
    env = {**os.environ, **TASK_ENV, "PYTHONPATH": f"{code}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [str(venv / "bin" / "python"), str(HERE / "differential.py"), "--dump", str(dump), "--model",
           str(export / "model"), "--train", str(export / "train.parquet"), "--reward-path", meta["reward_path"],
           "--out", str(out), "--temperature", str(args.temperature),
           "--first-budget", TASK_ENV["EDGE_TASK_FIRST_MAX_NEW_TOKENS"], "--mode", args.mode]
    subprocess.run(cmd, env=env, check=True)


def figures(run: Path, group_samples: int = 0) -> dict:
    """The toy's held-out evaluation of a run's final policy, as ``python -m verl_ext.toy --figures`` measures a
    verl checkpoint: ``run/model`` (the official trainer's HF directory) or, for a verl_ext run, its last
    checkpoint. ``group_samples`` = k adds k more T = 1 samples per prompt (``acc_group``). Written to
    ``run/end_figures.json`` (``run/end_figures_k<k>.json`` with k)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_ext.toy.build import DEFAULT_TASK, build_toy_assets, reason_split, reason_step0_figures
    from verl_ext.toy.model import load_checkpoint

    assets = build_toy_assets(task=DEFAULT_TASK, verbose=False)
    hf_dir = run / "model" if (run / "model").is_dir() else run if (run / "config.json").is_file() else None
    if hf_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(assets.model_path)  # the toy's own tokenizer, as for the verl runs
    else:
        latest = run / "checkpoints" / "latest_checkpointed_iteration.txt"
        if not latest.is_file():
            die(f"{run}: neither an HF model directory (model/) nor a verl checkpoint")
        model, tok = load_checkpoint(str(run / "checkpoints" / f"global_step_{latest.read_text().strip()}" / "actor"))
    torch.set_num_threads(1)
    result = reason_step0_figures(model, tok, reason_split(DEFAULT_TASK, assets.stats), group_samples=group_samples)
    for source, f in result.items():
        print(f"{source}: " + " ".join(f"{k}={v}" for k, v in f.items()))
    name = f"end_figures_k{group_samples}.json" if group_samples else "end_figures.json"
    (run / name).write_text(json.dumps(result))
    return result


def curves(run: Path) -> dict:
    """A run's training curves, in four blocks of its steps: all-wrong groups of the first attempts, their accuracy,
    accuracy after correction, response entropy (each side's own: the official trainer's ``entropy_mean``, an
    unmasked mean over the padded step; verl_ext's masked ``verl_ext/response_entropy_mean``), the gradient norm;
    and the median seconds per step."""
    import statistics

    if (run / "steps.jsonl").is_file():
        rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line.strip()]
        keys = {"all_wrong": ("toy/all_wrong_first",), "acc_first": ("toy/acc_first",),
                "acc_final": ("toy/acc_final",), "entropy": ("entropy_mean",), "grad_norm": ("grad_norm",),
                "step_s": ("step_s",)}
    else:  # GEC's own metrics where GEC ran, else the step's rewards (GEC off: first attempt = final)
        rows = [json.loads(line)["data"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "actor/grad_norm" in r]
        keys = {"all_wrong": ("gec/groups_all_wrong_before", "verl_ext/groups_all_wrong_frac"),
                "acc_first": ("gec/acc_before", "critic/score/mean"), "acc_final": ("gec/acc_after", "critic/score/mean"),
                "entropy": ("verl_ext/response_entropy_mean",), "grad_norm": ("actor/grad_norm",),
                "step_s": ("timing_s/step",)}
    out = {"steps": len(rows)}
    n = max(1, len(rows) // 4)
    for name, candidates in keys.items():
        key = next((k for k in candidates if rows and rows[0].get(k) is not None), candidates[0])
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        if not values:
            continue
        if name == "step_s":
            out[name] = round(statistics.median(values), 3)
        else:
            out[name] = [round(statistics.fmean(values[i:i + n]), 3) for i in range(0, len(values), n)][:4]
    return out


def summary(runs: list[Path]) -> None:
    """Per run: held-out figures (k-sample accuracy where measured, else one sample; greedy), curves."""
    for run in runs:
        fig_path = run / "end_figures_k8.json"
        figs = json.loads(fig_path.read_text()) if fig_path.is_file() else {}
        row = {s: (f.get("acc_group"), f.get("acc_greedy"), f.get("entropy_group")) for s, f in figs.items()}
        print(json.dumps({"run": run.name, "figures_k8": row, "curves": curves(run)}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="check the official checkout and that the patch applies")
    p.add_argument("--official", required=True)
    p = sub.add_parser("venv", help="build the side venv")
    p.add_argument("--official", required=True)
    p.add_argument("--venv", required=True)
    p = sub.add_parser("export", help="export the toy (HF model dir, parquets in the official format)")
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="run the official trainer on the toy, then the held-out evaluation")
    for key in ("--official", "--venv", "--export", "--out"):
        p.add_argument(key, required=True)
    p.add_argument("--method", choices=["grpo", "force_r_eda", "edge_grpo"], required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--save-steps", type=int, default=0, help="also save the model every N steps (checkpoint-N/)")
    p.add_argument("--masked-entropy", action="store_true",
                   help="diagnostic, not the official code: EDA's H_i over each response's own tokens "
                        "(masked_entropy.patch)")
    p = sub.add_parser("differential", help="one step of verl_ext replayed into the official trainer")
    for key in ("--official", "--venv", "--export", "--out"):
        p.add_argument(key, required=True)
    p.add_argument("--dump", default=None, help="verl's rollout dump of a verl_ext step (default: run one)")
    p.add_argument("--mode", choices=["gec", "force_reflect"], default="gec",
                   help="GEC's mode on both sides: EDGE-GRPO, or +Force-R & EDA")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--temperature", type=float, default=1.0)
    p = sub.add_parser("summary", help="held-out figures and training curves of runs (official or verl_ext)")
    p.add_argument("runs", nargs="+")
    p = sub.add_parser("figures", help="the toy's held-out evaluation of a run (official or verl_ext)")
    p.add_argument("--run", required=True)
    p.add_argument("--group-samples", type=int, default=0)
    args = ap.parse_args(argv)

    if args.cmd == "check":
        root = check_checkout(args.official)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            patched_copy(root, Path(tmp), masked_entropy=True)
        print(f"{root}: the official repository at {OFFICIAL_COMMIT}; toy_task.patch and masked_entropy.patch apply")
    elif args.cmd == "venv":
        check_checkout(args.official)
        build_venv(Path(args.venv).resolve())
    elif args.cmd == "export":
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        export_toy(out)
    elif args.cmd == "train":
        train(args)
    elif args.cmd == "differential":
        differential(args)
    elif args.cmd == "summary":
        summary([Path(r).resolve() for r in args.runs])
    else:
        figures(Path(args.run).resolve(), args.group_samples)


if __name__ == "__main__":
    main()
