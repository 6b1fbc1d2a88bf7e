"""``python -m verl_ext.main [hydra overrides]``: verl's PPO entry point with EDGE-GRPO / GEPO wired in.

Same override grammar as ``python -m verl.trainer.main_ppo``; the config is verl's ``ppo_trainer`` plus the
``algorithm.edge_grpo`` / ``algorithm.gepo`` / ``algorithm.gec`` nodes (``hydra_configs/base.yaml``).
Without ``--config-name`` it runs the embedded CPU demo, ``hydra_configs/toy_cpu.yaml``; on GPUs the paper presets
``--config-name edge_grpo_paper`` / ``gepo_paper`` or the generic base ``--config-name verl_ext``.
"""

from __future__ import annotations

import functools
import os
import time

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

import verl_ext.plugin  # noqa: F401  (verl swallows plugin import errors; importing here surfaces them)
from verl_ext.config import register_structured_configs
from verl_ext.cpu import CPU_PLATFORM_ENV, enable_cpu_mode, is_cpu_support_active
from verl_ext.run_checks import validate_run_config

register_structured_configs()

RAY_LOG_GRACE_S = 2.0


@functools.lru_cache(maxsize=2)
def _toy_assets(task: str | None = None):
    from verl_ext.toy import build_toy_assets
    from verl_ext.toy.build import DEFAULT_TASK

    return build_toy_assets(task=task or DEFAULT_TASK)


# ${verl_ext_toy:model_path} etc.: the embedded task's files, built on first use and cached (hydra_configs/toy_cpu.yaml);
# ${verl_ext_toy:model_path,add}: those of the first toy task (hydra_configs/toy/add.yaml, `+toy=add`)
OmegaConf.register_new_resolver("verl_ext_toy", lambda key, task=None: getattr(_toy_assets(task), key), replace=True)


def run_dir() -> str:
    """The run's folder: Hydra's output dir inside ``python -m verl_ext.main`` (a single run or a multirun job);
    the current directory where the config was composed without a Hydra app (compose API in tests and tools)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


# ${verl_ext_run_dir:}: where metrics.jsonl and the toy's checkpoints go (hydra_configs/base.yaml, toy_cpu.yaml)
OmegaConf.register_new_resolver("verl_ext_run_dir", run_dir, replace=True)


def select_platform(config: DictConfig) -> None:
    """CPU mode is explicit (``verl_ext.cpu``): ``trainer.device=cpu`` turns it on here, before verl resolves its
    platform (importing ``verl.trainer.main_ppo`` does) and before Ray starts.

    ``VERL_PLATFORM=cpu`` then reaches every Ray worker by two routes: the driver's environment, which a local
    cluster started by ``ray.init`` inherits, and the job's ``ray_kwargs.ray_init.runtime_env.env_vars``, which Ray
    applies to every actor of the job (merged into actors' own ``env_vars``), also on an existing cluster.
    """
    from verl_ext.config import ConfigError

    if str(config.trainer.get("device", "")) == "cpu":
        try:
            enable_cpu_mode()
        except ValueError as e:
            raise ConfigError(f"trainer.device=cpu: {e}") from None
    if not is_cpu_support_active():
        return
    with open_dict(config):
        ray_init = config.ray_kwargs.ray_init
        if ray_init.get("runtime_env") is None:
            ray_init.runtime_env = {}
        if ray_init.runtime_env.get("env_vars") is None:
            ray_init.runtime_env.env_vars = {}
        ray_init.runtime_env.env_vars[CPU_PLATFORM_ENV] = "cpu"


def _command_line_keys() -> list[str]:
    """The keys the user set on the command line (Hydra's task overrides); empty outside a Hydra main."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [o.split("=", 1)[0] for o in HydraConfig.get().overrides.task]
    except Exception:  # not running under hydra.main (e.g. run() called from code)
        return []


def apply_platform_defaults(config: DictConfig) -> None:
    """On CPU, verl's vLLM rollout gets what vLLM's CPU build needs (``verl_ext.cpu.vllm_cpu``); values the user
    typed on the command line are kept, or refused if they cannot work there."""
    if is_cpu_support_active():
        from verl_ext.cpu.vllm_cpu import apply_cpu_vllm_rollout_defaults

        changed = apply_cpu_vllm_rollout_defaults(config, _command_line_keys())
        if changed:
            print("[verl_ext] vLLM rollout on CPU: " + ", ".join(f"{k}={v}" for k, v in changed.items()))


def prepare(config: DictConfig) -> None:
    """Everything before training, in place: platform, resolution, verl_ext's and verl's start-up checks.

    ``run`` trains on the result; ``python -m verl_ext.dry_run`` prints it (so a dry run refuses what a run would).
    """
    select_platform(config)  # first: the imports below resolve verl's platform

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    OmegaConf.resolve(config)  # here, where the verl_ext_toy resolver exists (verl's TaskRunner resolves again)
    apply_platform_defaults(config)  # before the checks, so they see what will run
    validate_run_config(config)  # verl_ext's start-up checks (verl_ext/run_checks.py), before verl's own
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def run(config: DictConfig) -> None:
    prepare(config)

    import ray
    from verl.trainer.main_ppo import run_ppo

    from verl_ext.verl_compat import check_trainers

    check_trainers(bool(config.trainer.use_v1))  # here, before Ray starts: a clear error on an unexpected verl
    from verl_ext.trainer.runner import ExtTaskRunnerLegacy, ExtTaskRunnerV1
    started_ray = not ray.is_initialized()  # run_ppo starts Ray if needed and never shuts it down
    try:
        run_ppo(config, task_runner_class=ExtTaskRunnerV1 if config.trainer.use_v1 else ExtTaskRunnerLegacy)
    finally:
        if started_ray:  # each job of a multirun (-m) gets a fresh Ray: no actors or resources left from the last
            # Ray's log monitor forwards the TaskRunner's stdout (the last step's console metrics) to this process
            # a moment later (every 0.1 s, more on a busy machine); shutting down at once would drop those lines
            time.sleep(RAY_LOG_GRACE_S)
            ray.shutdown()


def config_dir() -> str:
    """The Hydra configs: packaged as ``verl_ext/hydra_configs`` by an install (wheel, ``pip install .``), or the
    repository's top-level ``hydra_configs/`` beside the package (editable install, PYTHONPATH checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = (os.path.join(here, "hydra_configs"), os.path.join(os.path.dirname(here), "hydra_configs"))
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "base.yaml")):
            return candidate
    raise FileNotFoundError(f"verl_ext's Hydra configs are not installed: none of {list(candidates)} has base.yaml")


# No arguments: the embedded CPU demo (toy_cpu). Real runs: `--config-name edge_grpo_paper|gepo_paper|verl_ext`
# plus model/data overrides.
@hydra.main(config_path=config_dir(), config_name="toy_cpu", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
