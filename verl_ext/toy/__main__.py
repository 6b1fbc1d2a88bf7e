"""``python -m verl_ext.toy [--task reason|add] [--force] [--from-scratch [--ship]] [--cache-dir DIR]``: build (or
reuse) the toy assets and print their paths, fingerprint, weights hash and step-0 figures.

``--from-scratch`` runs the reasoning toy's warm-up instead of copying the packaged weights and says whether this
machine reproduces them; ``--ship`` then writes the build into the package (for a changed recipe)."""

from __future__ import annotations

import argparse
import json

from .build import DEFAULT_TASK, TASKS, build_toy_assets, ship_weights, shipped_weights, summarize


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_ext.toy", description=__doc__)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--task", default=DEFAULT_TASK, choices=TASKS, help=f"default {DEFAULT_TASK}")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--from-scratch", action="store_true",
                    help="warm the model up here instead of copying the packaged weights (implies --force)")
    ap.add_argument("--ship", action="store_true", help="with --from-scratch: write the weights into the package")
    ap.add_argument("--json", action="store_true", help="print the stats manifest as JSON too")
    args = ap.parse_args(argv)
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
