"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) advantage estimators.

Installing the package registers ``edge_grpo`` and ``gepo`` with verl's ``register_adv_est`` (through the
``verl.plugins`` entry point); ``python -m verl_ext.main`` runs verl's trainer with the glue that feeds them.
"""

from verl_ext.algos.history import GroupEntropyHistory
from verl_ext.config import EdgeGrpoConfig, GepoConfig, load_algorithm_config

__all__ = ["GroupEntropyHistory", "EdgeGrpoConfig", "GepoConfig", "load_algorithm_config"]
