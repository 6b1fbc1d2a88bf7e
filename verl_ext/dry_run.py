"""``python -m verl_ext.dry_run [--config-name NAME] [overrides ...]``: what ``python -m verl_ext.main`` would run,
composed, resolved and checked, printed as YAML; nothing is trained and no Ray, GPU, model or data file is needed.

Same arguments as ``python -m verl_ext.main`` (one job: no ``-m``). Unlike Hydra's own ``--cfg job --resolve``,
which prints the config without calling the run, this goes through ``verl_ext.main.prepare``: verl_ext's start-up
checks (``verl_ext.run_checks.validate_run_config``) and verl's ``validate_config``, so an invalid combination
fails here exactly as it would at start-up (exit 1, the error on stderr). The resolved config goes to stdout as one
YAML document (``---`` first); the ``examples/`` scripts call this with ``DRY_RUN=1``. The model and data files need
not exist (local training parquet files that do exist get verl_ext's agent_name check), and nothing is written (the
toy config's ``${verl_ext_toy:...}`` builds or reuses the cached toy assets, as a run would).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from omegaconf import DictConfig, OmegaConf


def compose_run_config(config_name: str, overrides: list[str]) -> DictConfig:
    """The job config ``python -m verl_ext.main --config-name <config_name> <overrides>`` would get from Hydra."""
    from hydra import compose, initialize_config_dir

    from verl_ext.main import config_dir

    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(prog="python -m verl_ext.dry_run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-name", "-cn", default="toy_cpu", help="as verl_ext.main (default: toy_cpu)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for verl_ext.main")
    args, unknown = p.parse_known_args(argv)
    if unknown:  # e.g. -m / --multirun, --cfg: Hydra flags that a single composed job has no meaning for
        p.error(f"unsupported argument(s) {unknown}: a dry run composes one job from --config-name and overrides")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from verl_ext.main import prepare

    try:
        config = compose_run_config(args.config_name, list(args.overrides))
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the config alone (verl's checks print)
            prepare(config, [override.split("=", 1)[0] for override in args.overrides])
    # Hydra/OmegaConf: a bad override or interpolation; verl_ext's ConfigError is a ValueError; verl's
    # validate_config raises ValueError or AssertionError
    except (HydraException, OmegaConfBaseException, ValueError, AssertionError) as e:
        print(f"dry run: refused: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("---")  # one YAML document per job: a loop of dry runs (examples/toy/sweep.sh) prints a valid stream
    print(OmegaConf.to_yaml(config), end="")
    sys.stdout.flush()
    print(f"dry run: --config-name {args.config_name} composed, resolved and passed verl_ext's and verl's start-up "
          "checks; nothing was trained", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
