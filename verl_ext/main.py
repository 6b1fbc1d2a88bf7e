"""``python -m verl_ext.main [hydra overrides]``: verl's PPO entry point with EDGE-GRPO / GEPO wired in.

Same override grammar as ``python -m verl.trainer.main_ppo``; the config is verl's ``ppo_trainer`` plus the
``algorithm.edge_grpo`` / ``algorithm.gepo`` / ``algorithm.gec`` nodes (``hydra_configs/verl_ext.yaml``).
Without ``--config-name`` it runs the embedded CPU demo, ``hydra_configs/toy_cpu.yaml``.
"""

from __future__ import annotations

import functools
import time

import hydra
from omegaconf import DictConfig, OmegaConf

import verl_ext.plugin  # noqa: F401  (verl swallows plugin import errors; importing here surfaces them)
from verl_ext.config import load_algorithm_config, register_structured_configs

register_structured_configs()

RAY_LOG_GRACE_S = 2.0


@functools.lru_cache(maxsize=1)
def _toy_assets():
    from verl_ext.toy import build_toy_assets

    return build_toy_assets()


# ${verl_ext_toy:model_path} etc.: the embedded task's files, built on first use and cached (hydra_configs/toy_cpu.yaml)
OmegaConf.register_new_resolver("verl_ext_toy", lambda key: getattr(_toy_assets(), key), replace=True)


def validate_extension_config(config: DictConfig) -> None:
    """Start-up checks of what verl_ext adds; raises ConfigError naming the key."""
    from verl_ext.config import ConfigError

    ext = load_algorithm_config(config.algorithm)
    estimator = str(config.algorithm.adv_estimator)
    rollout_corr = config.algorithm.get("rollout_correction", None) or {}
    bypass = bool(rollout_corr.get("bypass_mode", False)) if hasattr(rollout_corr, "get") else False
    needs_entropy = estimator == "edge_grpo" or (
        estimator == "gepo" and (ext.gepo.base == "edge_grpo" or ext.gepo.entropy_estimator == "full_entropy")
    )
    if needs_entropy and bypass:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} needs the per-token entropy of the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=true skips; turn bypass_mode off"
        )
    if estimator == "gepo" and ext.gepo.logprob_source == "rollout" and not (
        config.actor_rollout_ref.rollout.get("calculate_log_probs", False) or bypass
    ):
        raise ConfigError(
            "algorithm.gepo.logprob_source=rollout needs actor_rollout_ref.rollout.calculate_log_probs=true"
        )


def run(config: DictConfig) -> None:
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from verl_ext.trainer.runner import ExtTaskRunnerLegacy, ExtTaskRunnerV1

    OmegaConf.resolve(config)  # here, where the verl_ext_toy resolver exists (verl's TaskRunner resolves again)
    validate_extension_config(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    started_ray = not ray.is_initialized()  # run_ppo starts Ray if needed and never shuts it down
    try:
        run_ppo(config, task_runner_class=ExtTaskRunnerV1 if config.trainer.use_v1 else ExtTaskRunnerLegacy)
    finally:
        if started_ray:  # each job of a multirun (-m) gets a fresh Ray: no actors or resources left from the last
            # Ray's log monitor forwards the TaskRunner's stdout (the last step's console metrics) to this process
            # a moment later (every 0.1 s, more on a busy machine); shutting down at once would drop those lines
            time.sleep(RAY_LOG_GRACE_S)
            ray.shutdown()


# No arguments: the embedded CPU demo (toy_cpu). Real runs: `--config-name verl_ext` plus model/data overrides.
@hydra.main(config_path="../hydra_configs", config_name="toy_cpu", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
