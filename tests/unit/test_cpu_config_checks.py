"""verl_ext.cpu.config_checks: Ulysses sequence parallelism cannot run on CPU (verl exchanges the sequence slices only
inside the flash-attention forward it patches; the CPU model's sdpa attention is left as it is), refused at start-up
naming the key."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from verl_ext.config import ConfigError
from verl_ext.cpu.config_checks import ULYSSES_KEYS, check_cpu_run_config

# verl 0.9.1's Ulysses keys, one per role and config node, written out (a key left out of ULYSSES_KEYS would go
# unchecked); each is in verl's ppo_trainer config
ROLE_ULYSSES_KEYS = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
    "critic.ulysses_sequence_parallel_size",
    "critic.fsdp.ulysses_sequence_parallel_size",
)


@pytest.mark.parametrize("key", ROLE_ULYSSES_KEYS)
def test_a_cpu_run_is_refused_each_roles_ulysses_size_before_ray_starts_and_accepts_one(key):
    """``python -m verl_ext.main`` in CPU mode (the toy: trainer.device=cpu) refuses a Ulysses size of 2 for each
    role, naming the key, and accepts 1. On two CPU "GPUs" with remove-padding on, nothing else refuses a size of 2
    (verl's ``validate_config`` and the batch split accept it): without verl_ext's CPU check the run would start."""
    from verl_ext.dry_run import compose_run_config
    from verl_ext.main import prepare

    two_ranks = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.model.use_remove_padding=true"]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}=2: Ulysses sequence parallelism cannot run on CPU"):
        prepare(compose_run_config("toy_cpu", [*two_ranks, f"{key}=2"]), [])
    prepare(compose_run_config("toy_cpu", [*two_ranks, f"{key}=1"]), [])


@pytest.mark.parametrize("key", ULYSSES_KEYS)
def test_ulysses_is_refused_on_cpu_naming_the_key(key):
    config = OmegaConf.create({})
    OmegaConf.update(config, key, 2, force_add=True)
    with pytest.raises(ConfigError, match=rf"{key}=2: Ulysses sequence parallelism cannot run on CPU.*Set {key}=1"):
        check_cpu_run_config(config)


def test_no_sequence_parallelism_passes():
    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 1,
                                                               "fsdp_config": {"ulysses_sequence_parallel_size": 1}},
                                                     "ref": {"ulysses_sequence_parallel_size": 1}},
                               "critic": {"ulysses_sequence_parallel_size": 1}})
    check_cpu_run_config(config)
    check_cpu_run_config(OmegaConf.create({}))


def test_verl_exts_task_runners_refuse_it_in_cpu_mode_only(monkeypatch):
    from verl_ext import cpu
    from verl_ext.trainer.runner import check_platform_settings

    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 2}}})
    monkeypatch.setattr(cpu, "_ACTIVE", False)
    check_platform_settings(config)  # a GPU run: verl's Ulysses
    monkeypatch.setattr(cpu, "_ACTIVE", True)
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"):
        check_platform_settings(config)


def test_the_main_job_refuses_it_before_ray_starts():
    """``python -m verl_ext.main`` (and its dry run) checks the CPU settings with the rest of its start-up checks."""
    from verl_ext.dry_run import compose_run_config
    from verl_ext.main import prepare

    config = compose_run_config("toy_cpu", ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"):
        prepare(config, [])
