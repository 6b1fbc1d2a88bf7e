import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl_ext.config import ConfigError, EdgeGrpoConfig, GepoConfig, load_algorithm_config, register_structured_configs

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "hydra_configs")


def test_defaults_are_the_papers():
    cfg = load_algorithm_config(None)
    assert (cfg.gepo.alpha_low, cfg.gepo.alpha_high, cfg.gepo.beta_low, cfg.gepo.beta_high, cfg.gepo.ema_gamma) == (
        0.5, 0.2, 0.2, 0.3, 0.01)
    assert cfg.gepo.entropy_estimator == "token_mean" and cfg.gepo.stats_scope == "global"
    assert cfg.edge_grpo.factor_min is None and cfg.edge_grpo.factor_max is None


@pytest.mark.parametrize(
    "node, message",
    [
        ({"gepo": {"alpha_low": 1.5}}, r"algorithm\.gepo\.alpha_low=1\.5 is invalid: must be in \[0, 1\]"),
        ({"gepo": {"ema_gamma": 0.0}}, r"algorithm\.gepo\.ema_gamma=0\.0 is invalid: must be in \(0, 1\]"),
        ({"gepo": {"beta_high": -1}}, r"algorithm\.gepo\.beta_high=-1 is invalid: must be >= 0"),
        ({"gepo": {"entropy_estimator": "bogus"}}, r"algorithm\.gepo\.entropy_estimator='bogus'.*token_mean"),
        ({"gepo": {"stats_scope": "task"}}, r"algorithm\.gepo\.stats_scope='task'.*per_data_source"),
        ({"gepo": {"alpha_high": 0.5}}, r"algorithm\.gepo\.alpha_high=0\.5 is invalid: must be < "),
        ({"gepo": {"alpah_low": 0.4}}, r"unknown key\(s\) \['algorithm\.gepo\.alpah_low'\]"),
        ({"edge_grpo": {"factor_min": 3.0, "factor_max": 2.0}}, r"algorithm\.edge_grpo\.factor_min=3\.0"),
        ({"edge_grpo": {"entropy_eps": -1.0}}, r"algorithm\.edge_grpo\.entropy_eps=-1\.0"),
    ],
)
def test_validation_names_the_key_and_the_range(node, message):
    with pytest.raises(ConfigError, match=message):
        load_algorithm_config(node)


def test_hydra_config_composes_verl_with_the_new_nodes():
    register_structured_configs()
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_low=0.4",
                                                         "algorithm.adv_estimator=gepo"])
        assert cfg.algorithm.gepo.alpha_low == 0.4 and cfg.algorithm.gepo.alpha_high == 0.2
        assert cfg.algorithm.edge_grpo.entropy_eps == EdgeGrpoConfig().entropy_eps
        assert "actor_rollout_ref" in cfg and cfg.trainer.use_v1 in (True, False)  # verl's own config is there
        assert load_algorithm_config(cfg.algorithm).gepo == GepoConfig(alpha_low=0.4)
        with pytest.raises(Exception, match="alpha_low"):  # typed by the dataclass: not a float
            compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_low=abc"])


def test_start_up_validation_rejects_bad_values_and_combinations():
    from verl_ext.main import validate_extension_config

    register_structured_configs()
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_high=0.9"])
        with pytest.raises(ConfigError, match="alpha_high=0.9"):
            validate_extension_config(cfg)
        cfg = compose(config_name="verl_ext", overrides=["algorithm.adv_estimator=gepo",
                                                         "algorithm.gepo.logprob_source=rollout",
                                                         "actor_rollout_ref.rollout.calculate_log_probs=false"])
        with pytest.raises(ConfigError, match="calculate_log_probs"):
            validate_extension_config(cfg)
        cfg = compose(config_name="verl_ext")
        validate_extension_config(cfg)
        assert OmegaConf.select(cfg, "algorithm.adv_estimator") == "edge_grpo"
