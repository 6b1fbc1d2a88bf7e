"""``python -m verl_ext.toy [--task chain5_unsolved|chain6|add] [--force] [--from-scratch [--ship]] [--cache-dir DIR]``: build (or
reuse) the toy assets and print their paths, fingerprint, weights hash and step-0 figures.

``--from-scratch`` runs the reasoning toy's warm-up instead of copying the packaged weights and says whether this
machine reproduces them; ``--ship`` then writes the build into the package (for a changed recipe).
``--figures CHECKPOINT`` measures a run's checkpoint (``<run>/checkpoints/global_step_N``) the way the build measures
step 0: per data source, sampled and greedy accuracy, length, token entropy, cue use, empty replies, repair rate.
``--departures CHECKPOINT`` (or ``step0``, the packaged model): where its sampled replies to the held-out chains first
leave the reference solution (how many running totals they wrote right first; 8 replies a prompt)."""

from __future__ import annotations

import argparse
import json

from .build import DEFAULT_TASK, TASKS, build_toy_assets, ship_weights, shipped_weights, summarize


def print_checkpoint_figures(checkpoint: str, as_json: bool, task: str = DEFAULT_TASK,
                             departures: bool = False) -> dict:
    import os

    import torch

    from .build import REASON_TASKS, reason_departures, reason_split, reason_step0_figures
    from .model import load_checkpoint

    if task not in REASON_TASKS:
        raise SystemExit(f"--figures measures a reasoning toy's checkpoint: --task one of {list(REASON_TASKS)}")
    assets = build_toy_assets(task=task, verbose=False)
    split = reason_split(task, assets.stats)

    if checkpoint == "step0":  # the packaged model, an HF folder
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(assets.model_path).eval()
        tok = AutoTokenizer.from_pretrained(assets.model_path)
    else:
        actor = os.path.join(checkpoint, "actor") if os.path.isdir(os.path.join(checkpoint, "actor")) else checkpoint
        model, tok = load_checkpoint(actor)
    torch.set_num_threads(1)  # the build's figures are measured single-threaded too
    figures = (reason_departures if departures else reason_step0_figures)(model, tok, split)
    for source, f in figures.items():
        print(f"{source}: " + " ".join(f"{k}={v}" for k, v in f.items()))
    if as_json:
        print(json.dumps(figures))
    return figures


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_ext.toy", description=__doc__)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--task", default=DEFAULT_TASK, choices=TASKS, help=f"default {DEFAULT_TASK}")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--from-scratch", action="store_true",
                    help="warm the model up here instead of copying the packaged weights (implies --force)")
    ap.add_argument("--ship", action="store_true", help="with --from-scratch: write the weights into the package")
    ap.add_argument("--figures", metavar="CHECKPOINT", default=None,
                    help="measure a reasoning-toy checkpoint (<run>/checkpoints/global_step_N) like the build's step 0")
    ap.add_argument("--departures", metavar="CHECKPOINT", default=None,
                    help="where a checkpoint's (or step0's) sampled replies first leave the held-out chains' solutions")
    ap.add_argument("--json", action="store_true", help="print the stats manifest (or the figures) as JSON too")
    args = ap.parse_args(argv)
    if args.figures or args.departures:
        print_checkpoint_figures(args.figures or args.departures, args.json, args.task, departures=bool(args.departures))
        return
    if args.ship and not args.from_scratch:
        ap.error("--ship needs --from-scratch")
    shipped = shipped_weights(args.task)
    a = build_toy_assets(cache_dir=args.cache_dir, force=args.force, task=args.task, from_scratch=args.from_scratch)
    print(("built" if a.built else "cached") + f": {a.root}")
    print(f"model_path    = {a.model_path}")
    print(f"train_parquet = {a.train_parquet}")
    print(f"val_parquet   = {a.val_parquet}")
    print(f"reward_path   = {a.reward_path}")
    print(f"reward_name   = {a.reward_name}")
    print("build         : " + summarize(a.stats))
    if args.from_scratch and shipped is not None:
        same = a.stats["weights_sha256"] == shipped[1]["weights_sha256"]
        print("packaged      : " + ("the warm-up reproduced the packaged weights bit for bit" if same else
                                    f"the warm-up gave other weights than the packaged ones (built on "
                                    f"{shipped[1].get('cpu')}, this machine {a.stats.get('cpu')})"))
    if args.ship:
        print(f"shipped       : {ship_weights(a)}")
    if args.json:
        print(json.dumps(a.stats, indent=2))


if __name__ == "__main__":
    main()
