"""The sweep configs (hydra_configs/sweep/): every job they generate composes, passes validation and has its own
name (so its own output folder and checkpoints).  Jobs are expanded by Hydra's own basic sweeper and parser."""

import functools
import os

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import verl_ext.main  # noqa: F401  (registers the structured configs and the toy resolver)
from verl_ext.config import load_algorithm_config

CONFIG_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "hydra_configs"))
SWEEPS = sorted(name[:-5] for name in os.listdir(os.path.join(CONFIG_DIR, "sweep")) if name.endswith(".yaml"))


@functools.cache  # composing verl's config takes a while; each sweep is expanded once
def sweep_jobs(config_name: str, sweep: str, extra: tuple[str, ...] = ()) -> list:
    """The job configs ``python -m verl_ext.main --config-name <config_name> -m +sweep=<sweep> <extra>`` runs."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        base = compose(config_name=config_name, overrides=[f"+sweep={sweep}"], return_hydra_config=True)
        params = [f"{key}={value}" for key, value in base.hydra.sweeper.params.items()] + list(extra)
        [batch] = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)
        return [compose(config_name=config_name, overrides=[f"+sweep={sweep}", *job]) for job in batch]


def test_the_three_sweeps_exist():
    assert SWEEPS == ["estimator_seed", "gepo_alpha", "gepo_beta"]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_job_is_valid_and_has_its_own_name(sweep):
    jobs = sweep_jobs("toy_cpu", sweep)
    assert len(jobs) > 1
    for cfg in jobs:
        load_algorithm_config(cfg.algorithm)  # raises ConfigError on an invalid job
    names = [cfg.trainer.experiment_name for cfg in jobs]
    assert len(set(names)) == len(names), names


def test_estimator_seed_is_the_cartesian_product_with_the_seed_in_the_rollout():
    jobs = sweep_jobs("toy_cpu", "estimator_seed")
    pairs = {(cfg.algorithm.adv_estimator, cfg.data.seed) for cfg in jobs}
    assert pairs == {(e, s) for e in ["grpo", "edge_grpo", "gepo"] for s in [1, 2, 3]}
    assert all(cfg.actor_rollout_ref.rollout.seed == cfg.data.seed for cfg in jobs)
    narrowed = sweep_jobs("toy_cpu", "estimator_seed", ("data.seed=7",))  # the command line wins
    assert {cfg.data.seed for cfg in narrowed} == {7} and len(narrowed) == 3


def test_gepo_alpha_sweeps_only_ordered_pairs_and_keeps_the_other_gepo_keys():
    jobs = sweep_jobs("toy_cpu", "gepo_alpha")
    pairs = {(cfg.algorithm.gepo.alpha_low, cfg.algorithm.gepo.alpha_high) for cfg in jobs}
    grid = {(lo, hi) for lo in [0.3, 0.5, 0.8] for hi in [0.1, 0.2, 0.4] if hi < lo}
    assert pairs == grid and (0.5, 0.2) in pairs  # the paper's pair is in it
    for cfg in jobs:
        assert cfg.algorithm.adv_estimator == "gepo"
        assert cfg.algorithm.gepo.enforce_alpha_order and cfg.algorithm.gepo.beta_low == 0.2  # merged, not replaced


def test_gepo_beta_grid():
    jobs = sweep_jobs("toy_cpu", "gepo_beta")
    pairs = {(cfg.algorithm.gepo.beta_low, cfg.algorithm.gepo.beta_high) for cfg in jobs}
    assert pairs == {(lo, hi) for lo in [0.1, 0.2, 0.5] for hi in [0.1, 0.3, 0.5]} and (0.2, 0.3) in pairs


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweeps_apply_to_the_gpu_config_too(sweep):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="verl_ext", overrides=[f"+sweep={sweep}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params  # each job in multirun/<time>/<job number>_<experiment> (base.yaml)
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}_${trainer.experiment_name}"
    load_algorithm_config(cfg.algorithm)
