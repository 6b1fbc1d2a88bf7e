"""``python -m verl_ext.main [hydra overrides]``: verl's PPO entry point with EDGE-GRPO / GEPO wired in.

Same override grammar as ``python -m verl.trainer.main_ppo``; the config is verl's ``ppo_trainer`` plus the
``algorithm.edge_grpo`` / ``algorithm.gepo`` / ``algorithm.gec`` nodes (``hydra_configs/base.yaml``).
Without ``--config-name`` it runs the embedded CPU demo, ``hydra_configs/toy_cpu.yaml``; on GPUs the paper presets
``--config-name edge_grpo_paper`` / ``gepo_paper`` or the generic base ``--config-name verl_ext``.
"""

from __future__ import annotations

import functools

import hydra
from omegaconf import DictConfig, OmegaConf

import verl_ext.plugin  # noqa: F401  (verl swallows plugin import errors; importing here surfaces them)
from verl_ext.config import register_structured_configs, validate_run_config

register_structured_configs()


@functools.lru_cache(maxsize=1)
def _toy_assets():
    from verl_ext.toy import build_toy_assets

    return build_toy_assets()


# ${verl_ext_toy:model_path} etc.: the embedded task's files, built on first use and cached (hydra_configs/toy_cpu.yaml)
OmegaConf.register_new_resolver("verl_ext_toy", lambda key: getattr(_toy_assets(), key), replace=True)


def run(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from verl_ext.trainer.runner import ExtTaskRunnerLegacy, ExtTaskRunnerV1

    OmegaConf.resolve(config)  # here, where the verl_ext_toy resolver exists (verl's TaskRunner resolves again)
    validate_run_config(config)  # verl_ext's start-up checks (verl_ext/config.py), before verl's own
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ExtTaskRunnerV1 if config.trainer.use_v1 else ExtTaskRunnerLegacy)


# No arguments: the embedded CPU demo (toy_cpu). Real runs: `--config-name edge_grpo_paper|gepo_paper|verl_ext`
# plus model/data overrides.
@hydra.main(config_path="../hydra_configs", config_name="toy_cpu", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
