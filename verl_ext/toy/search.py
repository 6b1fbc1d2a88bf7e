"""``python -m verl_ext.toy.search``: the reasoning toy's model size x hard-split design search (docs/toy.md, "Design
search"), by the testbed's own criteria, before any RL run.

A cell (``designs.parse_cell``) is a hard-split design (``designs.py``; ``NAME[@SHARE]``) and a model size
(``h<hidden>l<layers>``, optional ``a<heads>k<kv heads>i<intermediate>``; default heads of size 32, half as many KV
heads, intermediate 2 x hidden), with the warm-up recipe ``designs.REASON_SFT`` unless the spec overrides it
(``twodigit/h128l4:steps=1500,lr=2e-3``). Per
cell, from scratch: the warm-up, the step-0 figures per family (``build.reason_step0_figures`` with 8-sample groups),
then the supervised control (``sft_control.sft_on_solutions``, 60 steps, the RL run's prompts) on the hard split's
solutions alone and on every family's, seeds 1 2 3, with the figures after each; then criteria a, b, c:

* a: ``toy_chain`` >= 0.80 sampled; ``toy_bag``'s token entropy >= 5 x ``toy_chain``'s; the hard split <= 0.05
  sampled, >= 70% of its 8-sample groups all wrong, its median reply length within 10% of its reference solutions';
* b: hard-only control: ``toy_chain`` within 0.05 of step 0 on every seed, the hard split up >= 0.10 on average;
* c: mixture control: every family within 0.05 of step 0 or above, on every seed.

"Sampled" is the accuracy over 8 samples per held-out prompt (``acc_group``), as validation's ``mean@1``.

Each warm-up and each control runs in its own forked process, one torch thread (``--jobs`` at once); a control starts
when its cell's warm-up is done. A unit that fails or passes ``--unit-timeout`` records its error and the rest go on;
``--deadline`` stops everything in time to write the summary. Every finished unit rewrites its cell's JSON
(``--out``/<cell>.json) and the summary (``--out``/summary.json, and ``--summary``).

verl is not imported: the controls' prompts (verl's sampler order) come precomputed from ``--prompts`` (default
``search_prompts.json`` beside this file), written by ``--precompute-prompts FILE`` on a machine with verl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

from . import build, designs, reason
from .designs import Cell, parse_cell

PROMPTS_FILE = Path(__file__).with_name("search_prompts.json")
SEEDS = (1, 2, 3)
POOLS = ("hard", "mixture")
SFT_STEPS = 60
GROUP_SAMPLES = 8
QUICK = {"warmup_steps": 50, "sft_steps": 5, "n_val": 20}
DEFAULT_SIZES = ("h64l2", "h128l2", "h128l4", "h256l4")
DEFAULT_CELLS = tuple(f"{d}/{s}" for s in DEFAULT_SIZES for d in designs.DESIGNS)
EASY, BAG = reason.DATA_SOURCE_CHAIN, reason.DATA_SOURCE_BAG
# the criteria's thresholds (docs/toy.md, "Design search")
EASY_MIN, ENTROPY_RATIO, HARD_MAX, ALL_WRONG_MIN, LEN_TOL, DROP_TOL, HARD_GAIN = 0.80, 5.0, 0.05, 0.70, 0.10, 0.05, 0.10


# ---------------------------------------------------------------- the controls' prompts, precomputed with verl


def pool_sources(design: designs.HardDesign, pool: str) -> tuple[str, ...] | None:
    return (design.source,) if pool == "hard" else None


def _rows_sha(rows) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def precompute_prompts(path: str | os.PathLike, seeds=SEEDS, steps: int = SFT_STEPS) -> dict:
    """Each hard split's control batches (row indices into ``designs.train_rows``: the hard-only and the mixture
    pool), seeds ``seeds``, ``steps`` steps, from verl's sampler (``sft_control.step_indices``), into ``path``."""
    from .sft_control import step_indices

    out = {"version": 1, "steps": steps, "seeds": list(seeds), "pools": {}}
    for source, design in {d.source: d for d in designs.FIXED_DESIGNS.values()}.items():
        entry = out["pools"][source] = {}
        for pool in POOLS:
            rows = designs.train_rows(design, pool_sources(design, pool))
            entry[pool] = {"rows_sha256": _rows_sha(rows), "n_rows": len(rows),
                           "batches": {str(s): step_indices(s, steps, len(rows)) for s in seeds}}
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    return out


def control_prompts(prompts: dict, design: designs.HardDesign, pool: str, seed: int, steps: int,
                    chosen: dict | None = None):
    """The precomputed (data source, operands) of each step of a control, checked against the design's pool.

    A selecting design's pool is known after its warm-up only (``chosen``): verl's sampler order depends on the pool's
    size alone, so its batches are those of a fixed design's pool of the same size."""
    if design.unsolved_of:
        rows = designs.train_rows(design, pool_sources(design, pool), chosen)
        entry = next((e[pool] for e in prompts["pools"].values() if e[pool]["n_rows"] == len(rows)), None)
        if entry is None:
            raise KeyError(f"no precomputed prompts for a pool of {len(rows)} rows: rerun --precompute-prompts")
    elif design.source not in prompts["pools"]:
        raise KeyError(f"no precomputed prompts for the hard split {design.source!r}: rerun --precompute-prompts")
    else:
        entry = prompts["pools"][design.source][pool]
        rows = designs.train_rows(design, pool_sources(design, pool))
        if _rows_sha(rows) != entry["rows_sha256"]:
            raise ValueError(f"the precomputed prompts of {design.source!r} ({pool}) are for another RL pool: rerun "
                             "--precompute-prompts")
    if str(seed) not in entry["batches"] or steps > prompts["steps"]:
        raise KeyError(f"no precomputed prompts for seed {seed} x {steps} steps: rerun --precompute-prompts")
    return [[tuple(rows[i]) for i in batch] for batch in entry["batches"][str(seed)][:steps]]


# ---------------------------------------------------------------- the units: a warm-up, a control


def _tokenizer():
    from .tokenizer import build_tokenizer

    return build_tokenizer()


def run_warmup(cell: Cell, work: Path, opts: dict) -> dict:
    """Warm the cell's model up from scratch, save it under ``work`` (a selecting design's hard split beside it),
    and measure its step-0 figures."""
    import torch

    t0 = time.time()
    tok = _tokenizer()
    model, sft = build.warm_up(cell, tok, opts["device"])
    split = designs.split_for(cell.design, warmup_only=True)
    examples = designs.warmup_examples(cell.design, split, cell.recipe)  # their shares, for the record
    model_dir = work / "model"
    model.to("cpu").save_pretrained(str(model_dir), safe_serialization=True)
    model.to(opts["device"])
    t1 = time.time()
    selection = None
    with torch.no_grad():
        if cell.design.unsolved_of:
            selection = build.select_unsolved(model, tok, cell.design, designs.SEED)
            _write_json(work / "hard_split.json", selection)
            split = designs.split_for(cell.design, chosen=selection)
        t2 = time.time()
        figures = build.reason_step0_figures(model, tok, split, group_samples=GROUP_SAMPLES, n_val=opts["n_val"])
    return {"sft": sft, "n_params": sum(p.numel() for p in model.parameters()),
            "weights_sha256": build.weights_sha256(model_dir), "step0": figures,
            "warmup_seconds": round(t1 - t0, 1), "figures_seconds": round(time.time() - t2, 1),
            "warmup_share": _warmup_shares(examples, split),
            "selection": selection and {k: v for k, v in selection.items() if k not in ("val", "train")}
            | {"seconds": round(t2 - t1, 1)}}


def _chosen(design: designs.HardDesign, warm: Path) -> dict | None:
    if not design.unsolved_of:
        return None
    with open(warm / "hard_split.json") as f:
        return json.load(f)


def _warmup_shares(examples, split) -> dict:
    """The share of each warm-up family among the examples (read back from their prompts)."""
    extra = {s: set(v) for s, v in split.warmup.items() if s not in (EASY, BAG)}
    counts = dict.fromkeys(split.warmup, 0)
    for prompt, _, _ in examples:
        ops = tuple(int(x) for x in re.findall(r"\d+", prompt))
        counts[BAG if prompt.startswith("{") else next((s for s, v in extra.items() if ops in v), EASY)] += 1
    return {s: round(n / len(examples), 4) for s, n in counts.items()}


def run_control(cell: Cell, warm: Path, pool: str, seed: int, prompts: dict, opts: dict) -> dict:
    """The supervised control of one pool and seed on the cell's warmed-up model (in ``warm``), at the cell's
    ``rl_lr``, and the figures after it."""
    import torch
    from transformers import AutoModelForCausalLM

    from .sft_control import sft_on_solutions

    t0 = time.time()
    tok = _tokenizer()
    model = AutoModelForCausalLM.from_pretrained(str(warm / "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa").to(opts["device"])
    chosen = _chosen(cell.design, warm)
    batches = control_prompts(prompts, cell.design, pool, seed, opts["sft_steps"], chosen)
    trained = sft_on_solutions(model, tok, seed, prompts_per_step=batches, lr=cell.rl_lr)
    t1 = time.time()
    figures = build.reason_step0_figures(model, tok, designs.split_for(cell.design, chosen=chosen),
                                         group_samples=GROUP_SAMPLES, n_val=opts["n_val"])
    steps = trained["steps"]
    return {"pool": pool, "seed": seed, "steps": len(steps), "solutions": sum(s["solutions"] for s in steps),
            "acc_before_first_last": [steps[0]["acc_before"], steps[-1]["acc_before"]], "after": figures,
            "sft_seconds": round(t1 - t0, 1), "figures_seconds": round(time.time() - t1, 1)}


def _unit_main(kind: str, spec: str, pool: str | None, seed: int | None, work: str, prompts_path: str | None,
               opts: dict, result: str) -> None:
    """A unit in its own process: one torch thread; its result (or its error) as JSON at ``result``. ``work``: the
    warm-up's folder, where the model is written, or read by a control."""
    t0 = time.time()
    try:
        import torch

        torch.set_num_threads(1)
        cell = parse_cell(spec, opts.get("warmup_steps"))
        if kind == "warmup":
            out = run_warmup(cell, Path(work), opts)
        else:
            with open(prompts_path) as f:
                prompts = json.load(f)
            out = run_control(cell, Path(work), pool, seed, prompts, opts)
        out["ok"] = True
    except BaseException as e:  # recorded, the search goes on
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out["seconds"] = round(time.time() - t0, 1)
    tmp = result + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, result)


# ---------------------------------------------------------------- criteria


def _acc(fig: dict) -> float:
    return fig.get("acc_group", fig["acc_t1"])


def criteria(record: dict) -> dict:
    """Criteria a, b, c of a cell's record (``None`` where a figure is missing: a failed or unfinished unit)."""
    out = {}
    step0 = (record.get("warmup") or {}).get("step0")
    hard = record["hard_source"]
    if step0:
        e, b, h = step0[EASY], step0[BAG], step0[hard]
        ratio = b["entropy_group"] / max(e["entropy_group"], 1e-9)
        len_off = h["median_len_group"] / h["ref_median_len"] - 1
        checks = {"easy_acc": _acc(e) >= EASY_MIN, "entropy_ratio": ratio >= ENTROPY_RATIO,
                  "hard_acc": _acc(h) <= HARD_MAX, "all_wrong": h["all_wrong_groups"] >= ALL_WRONG_MIN,
                  "complete_attempts": abs(len_off) <= LEN_TOL}
        out["a"] = {"pass": all(checks.values()), "checks": checks, "easy_acc": _acc(e),
                    "entropy_ratio": round(ratio, 2), "hard_acc": _acc(h), "all_wrong": h["all_wrong_groups"],
                    "hard_len": h["median_len_group"], "hard_ref_len": h["ref_median_len"],
                    "hard_len_off": round(len_off, 3)}
    else:
        out["a"] = None
    controls = record.get("controls", {})
    for key, pool in (("b", "hard"), ("c", "mixture")):
        runs = [controls.get(f"{pool}-{s}") for s in record["seeds"]]
        if not step0 or not all(r and r.get("ok") for r in runs):
            out[key] = None
            continue
        delta = {s: [round(_acc(r["after"][s]) - _acc(step0[s]), 4) for r in runs] for s in step0}
        if key == "b":
            gain = statistics.fmean(delta[hard])
            checks = {"easy_kept": min(delta[EASY]) >= -DROP_TOL, "hard_gain": gain >= HARD_GAIN}
            out[key] = {"pass": all(checks.values()), "checks": checks, "delta": delta,
                        "easy_worst": min(delta[EASY]), "hard_gain_mean": round(gain, 4)}
        else:
            worst = min(min(v) for v in delta.values())
            out[key] = {"pass": worst >= -DROP_TOL, "delta": delta, "worst": worst}
    return out


# ---------------------------------------------------------------- the search


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def search(specs: list[str], out: Path, jobs: int, opts: dict, prompts_path: str, unit_timeout: float,
           deadline: float | None, summary_path: Path | None = None, seeds=SEEDS, log=print) -> dict:
    """Run the cells' units, ``jobs`` processes at once; returns the summary (also written as units finish)."""
    import multiprocessing as mp

    import torch  # noqa: F401  (imported once here: the forked units inherit it)
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: F401

    ctx = mp.get_context("fork")
    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    cells = {c.name: c for c in (parse_cell(s, opts.get("warmup_steps")) for s in specs)}
    with open(prompts_path) as f:  # checked now, not in 16 processes later
        prompts = json.load(f)
    for c in cells.values():
        for pool in POOLS:
            for s in seeds:
                if not c.design.unsolved_of:  # a selecting design's pool is known after its warm-up
                    control_prompts(prompts, c.design, pool, s, opts["sft_steps"])
    records = {name: {"cell": c.spec, "design": c.design.label, "size": c.size, "hard_source": c.design.source,
                      "warmup_source": c.design.warmup_source, "warmup_share": c.design.warmup_share,
                      "unsolved_of": c.design.unsolved_of, "model": c.model_kw, "recipe": c.recipe,
                      "rl_lr": c.rl_lr, "n_params_est": c.n_params(), "seeds": list(seeds),
                      "opts": opts, "warmup": None, "controls": {}, "errors": [], "unit_seconds": 0.0}
               for name, c in cells.items()}
    # one warm-up per warm-up key, run under its first cell's name and shared by the key's other cells
    sharing: dict[str, list[str]] = {}
    for name, c in cells.items():
        sharing.setdefault(c.warmup_key, []).append(name)
    warm_of = {name: names[0] for names in sharing.values() for name in names}
    queue = [("warmup", names[0], None, None)
             for names in sorted(sharing.values(), key=lambda ns: -cells[ns[0]].n_params())]
    running: dict = {}

    def save(name=None):
        for n in [name] if name else list(records):
            records[n]["criteria"] = criteria(records[n])
            _write_json(out / f"{n}.json", records[n])
        summary = {"elapsed_seconds": round(time.time() - t_start, 1), "jobs": jobs, "opts": opts,
                   "cells": records, "table": table_rows(records)}
        _write_json(out / "summary.json", summary)
        if summary_path is not None:
            _write_json(summary_path, summary)
        return summary

    def finish(key, proc_info, error=None):
        kind, name, pool, seed = key
        res_path = proc_info["result"]
        if error is None and os.path.exists(res_path):
            with open(res_path) as f:
                res = json.load(f)
        else:
            res = {"ok": False, "error": error or f"exit code {proc_info['proc'].exitcode}, no result",
                   "seconds": round(time.time() - proc_info["t0"], 1)}
        label = "warm-up" if kind == "warmup" else f"control {pool} seed {seed}"
        owners = sharing[cells[name].warmup_key] if kind == "warmup" else [name]
        for n in owners:
            rec = records[n]
            rec["unit_seconds"] = round(rec["unit_seconds"] + res.get("seconds", 0.0), 1)
            if not res.get("ok"):
                rec["errors"].append({"unit": label, "error": res.get("error"), "traceback": res.get("traceback")})
            if kind == "warmup":
                rec["warmup"] = dict(res, shared_with=owners) if len(owners) > 1 else res
                if res.get("ok"):
                    queue.extend(("control", n, p, s) for p in POOLS for s in seeds)
            else:
                rec["controls"][f"{pool}-{seed}"] = res
            save(n)
        state = "ok" if res.get("ok") else f"FAILED ({res.get('error')})"
        log(f"[{time.time() - t_start:6.0f} s] {name}: {label} {state} in {res.get('seconds')} s")

    save()
    while queue or running:
        now = time.time()
        past_deadline = deadline is not None and now - t_start >= deadline
        while queue and len(running) < jobs and not past_deadline:
            key = queue.pop(0)
            kind, name, pool, seed = key
            work, warm = out / "work" / name, out / "work" / warm_of[name]
            work.mkdir(parents=True, exist_ok=True)
            result = str(work / (f"{kind}.json" if kind == "warmup" else f"control-{pool}-{seed}.json"))
            if os.path.exists(result):
                os.remove(result)
            proc = ctx.Process(target=_unit_main, args=(kind, cells[name].spec, pool, seed, str(warm), prompts_path,
                                                       opts, result), daemon=True)
            proc.start()
            running[key] = {"proc": proc, "t0": time.time(), "result": result}
        for key, info in list(running.items()):
            proc = info["proc"]
            if not proc.is_alive():
                proc.join()
                del running[key]
                finish(key, info)
            elif time.time() - info["t0"] > unit_timeout or past_deadline:
                proc.kill()
                proc.join()
                del running[key]
                why = "the search's deadline" if past_deadline else "the unit timeout"
                finish(key, info, error=f"killed at {why} after {time.time() - info['t0']:.0f} s")
        if past_deadline and queue:
            for kind, name, pool, seed in queue:
                label = "warm-up" if kind == "warmup" else f"control {pool} seed {seed}"
                records[name]["errors"].append({"unit": label, "error": "not started: the search's deadline"})
            queue.clear()
            save()
        time.sleep(0.2)
    return save()


def table_rows(records: dict) -> list[dict]:
    """One row per cell: the criteria's figures and the time it took (single-core seconds of its units)."""
    rows = []
    for name, rec in records.items():
        cr = rec.get("criteria") or criteria(rec)
        a, b, c = cr.get("a"), cr.get("b"), cr.get("c")
        warm = rec.get("warmup") or {}
        rows.append({
            "cell": name, "params": warm.get("n_params", rec["n_params_est"]),
            "warmup_s": warm.get("warmup_seconds"), "unit_s": rec["unit_seconds"],
            "easy": a and a["easy_acc"], "H_ratio": a and a["entropy_ratio"], "hard": a and a["hard_acc"],
            "all_wrong": a and a["all_wrong"], "len/ref": a and f"{a['hard_len']}/{a['hard_ref_len']}",
            "a": a and a["pass"], "b_easy_worst": b and b["easy_worst"], "b_hard_gain": b and b["hard_gain_mean"],
            "b": b and b["pass"], "c_worst": c and c["worst"], "c": c and c["pass"], "errors": len(rec["errors"]),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "(no cells)"
    cols = list(rows[0])
    cells = [[("-" if r[k] is None else str(r[k])) for k in cols] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(cols)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(cols, width))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(c, width)) for c in cells]
    return "\n".join(lines)


def plot_control_b(summary: dict, png: str | os.PathLike) -> None:
    """The size x design figure: each cell's hard-only control, ``toy_chain``'s change against the hard split's gain
    (seeds: mean and range), with criterion b's region marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    for rec in summary["cells"].values():
        b = (rec.get("criteria") or {}).get("b") or {}
        if "delta" not in b:
            continue
        easy, gain = np.array(b["delta"][reason.DATA_SOURCE_CHAIN]), np.array(b["delta"][rec["hard_source"]])
        ax.errorbar(gain.mean(), easy.mean(), xerr=[[gain.mean() - gain.min()], [gain.max() - gain.mean()]],
                    yerr=[[easy.mean() - easy.min()], [easy.max() - easy.mean()]], fmt="o", capsize=3,
                    label=rec["cell"])
    ax.axhspan(-DROP_TOL, DROP_TOL, color="green", alpha=0.1)
    ax.axvline(HARD_GAIN, color="green", ls="--", lw=1)
    ax.set_xlabel("hard split, sampled accuracy gain (seeds: mean, range)")
    ax.set_ylabel(f"{reason.DATA_SOURCE_CHAIN}, sampled accuracy change")
    ax.set_title("Supervised control on the hard split's solutions alone\n"
                 "criterion b: inside the green band and right of the dashed line")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_ext.toy.search", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", nargs="*", default=None,
                    help="DESIGN[@SHARE]/SIZE[:key=value,...] (default: every design x " + " ".join(DEFAULT_SIZES) + ")")
    ap.add_argument("--designs", nargs="*", default=None, help="with --sizes: their product as cells")
    ap.add_argument("--sizes", nargs="*", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=None, help="folder: one JSON per cell, summary.json, the units' work")
    ap.add_argument("--summary", default=None, help="also write the summary here, as units finish")
    ap.add_argument("--prompts", default=str(PROMPTS_FILE), help="the precomputed control prompts")
    ap.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    ap.add_argument("--warmup-steps", type=int, default=None, help="every cell's warm-up length (default its recipe's)")
    ap.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    ap.add_argument("--n-val", type=int, default=None, help="held-out prompts per family (default all 100)")
    ap.add_argument("--quick", action="store_true", help="smoke test: " + json.dumps(QUICK))
    ap.add_argument("--device", default="cpu", help="torch device of the units (default cpu)")
    ap.add_argument("--unit-timeout", type=float, default=3600.0, help="seconds before a unit is killed")
    ap.add_argument("--deadline", type=float, default=None, help="seconds after which the search stops")
    ap.add_argument("--precompute-prompts", metavar="FILE", default=None,
                    help="write the controls' prompts (needs verl) and exit")
    ap.add_argument("--table", metavar="SUMMARY", default=None, help="print a summary's table and exit")
    ap.add_argument("--figure", nargs=2, metavar=("SUMMARY", "PNG"), default=None,
                    help="draw a summary's size x design figure (the hard-only control) and exit")
    args = ap.parse_args(argv)
    if args.precompute_prompts:
        data = precompute_prompts(args.precompute_prompts, tuple(args.seeds), args.sft_steps)
        print(f"wrote {args.precompute_prompts}: {list(data['pools'])} x {list(POOLS)}, seeds {data['seeds']}, "
              f"{data['steps']} steps ({os.path.getsize(args.precompute_prompts)} bytes)")
        return
    if args.figure:
        with open(args.figure[0]) as f:
            plot_control_b(json.load(f), args.figure[1])
        return
    if args.table:
        with open(args.table) as f:
            print(format_table(json.load(f)["table"]))
        return
    if args.out is None:
        ap.error("--out is required")
    specs = list(args.cells or [])
    if args.designs or args.sizes:
        specs += [f"{d}/{s}" for s in (args.sizes or DEFAULT_SIZES) for d in (args.designs or list(designs.DESIGNS))]
    specs = specs or list(DEFAULT_CELLS)
    opts = {"sft_steps": args.sft_steps, "n_val": args.n_val, "device": args.device, "warmup_steps": args.warmup_steps}
    if args.quick:  # QUICK's settings where no option set them
        opts["sft_steps"] = QUICK["sft_steps"] if args.sft_steps == SFT_STEPS else args.sft_steps
        opts["warmup_steps"] = args.warmup_steps or QUICK["warmup_steps"]
        opts["n_val"] = args.n_val or QUICK["n_val"]
    print(f"[toy.search] {len(specs)} cells, --jobs {args.jobs}, {opts}", flush=True)
    summary = search(specs, Path(args.out), args.jobs, opts, args.prompts, args.unit_timeout, args.deadline,
                     Path(args.summary) if args.summary else None, tuple(args.seeds),
                     log=lambda m: print(m, flush=True))
    print(format_table(summary["table"]))
    print(f"[toy.search] {summary['elapsed_seconds']} s; summary: {Path(args.out) / 'summary.json'}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
