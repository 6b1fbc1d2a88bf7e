"""``python -m verl_ext.main [hydra overrides]``: verl's PPO entry point with EDGE-GRPO / GEPO wired in.

Same override grammar as ``python -m verl.trainer.main_ppo``; the config is verl's ``ppo_trainer`` plus the
``algorithm.edge_grpo`` / ``algorithm.gepo`` / ``algorithm.gec`` nodes (``hydra_configs/verl_ext.yaml``).
Without ``--config-name`` it runs the embedded CPU demo, ``hydra_configs/toy_cpu.yaml``.
"""

from __future__ import annotations

import functools

import hydra
from omegaconf import DictConfig, OmegaConf

import verl_ext.plugin  # noqa: F401  (verl swallows plugin import errors; importing here surfaces them)
from verl_ext.config import load_algorithm_config, register_structured_configs

register_structured_configs()


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


def _command_line_keys() -> list[str]:
    """The keys the user set on the command line (Hydra's task overrides); empty outside a Hydra main."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [o.split("=", 1)[0] for o in HydraConfig.get().overrides.task]
    except Exception:  # not running under hydra.main (e.g. run() called from code)
        return []


def apply_platform_defaults(config: DictConfig, explicit_keys: list[str]) -> None:
    """On CPU, verl's vLLM rollout gets what vLLM's CPU build needs (``verl_ext.cpu.vllm_cpu``)."""
    from verl_ext.cpu import is_cpu_support_active

    if is_cpu_support_active():
        from verl_ext.cpu.vllm_cpu import apply_cpu_vllm_rollout_defaults

        changed = apply_cpu_vllm_rollout_defaults(config, explicit_keys)
        if changed:
            print("[verl_ext] vLLM rollout on CPU: " + ", ".join(f"{k}={v}" for k, v in changed.items()))


def run(config: DictConfig, explicit_keys: list[str] = ()) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from verl_ext.trainer.runner import ExtTaskRunnerLegacy, ExtTaskRunnerV1

    OmegaConf.resolve(config)  # here, where the verl_ext_toy resolver exists (verl's TaskRunner resolves again)
    validate_extension_config(config)
    apply_platform_defaults(config, list(explicit_keys))
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ExtTaskRunnerV1 if config.trainer.use_v1 else ExtTaskRunnerLegacy)


# No arguments: the embedded CPU demo (toy_cpu). Real runs: `--config-name verl_ext` plus model/data overrides.
@hydra.main(config_path="../hydra_configs", config_name="toy_cpu", version_base=None)
def main(config: DictConfig) -> None:
    run(config, _command_line_keys())


if __name__ == "__main__":
    main()
