"""``python -m verl_ext.toy [--task reason|add] [--force] [--cache-dir DIR]``: build (or reuse) the toy assets and
print their paths, fingerprint, weights hash and step-0 figures."""

from __future__ import annotations

import argparse
import json

from .build import DEFAULT_TASK, TASKS, build_toy_assets, summarize


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_ext.toy", description=__doc__)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--task", default=DEFAULT_TASK, choices=TASKS, help=f"default {DEFAULT_TASK}")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--json", action="store_true", help="print the stats manifest as JSON too")
    args = ap.parse_args(argv)
    a = build_toy_assets(cache_dir=args.cache_dir, force=args.force, task=args.task)
    print(("built" if a.built else "cached") + f": {a.root}")
    print(f"model_path    = {a.model_path}")
    print(f"train_parquet = {a.train_parquet}")
    print(f"val_parquet   = {a.val_parquet}")
    print(f"reward_path   = {a.reward_path}")
    print(f"reward_name   = {a.reward_name}")
    print("build         : " + summarize(a.stats))
    if args.json:
        print(json.dumps(a.stats, indent=2))


if __name__ == "__main__":
    main()
