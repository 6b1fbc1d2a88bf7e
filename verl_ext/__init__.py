"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) advantage estimators.

Installing the package registers ``edge_grpo`` and ``gepo`` with verl's ``register_adv_est`` (through the
``verl.plugins`` entry point, lazily: when verl's ``core_algos`` is imported); ``python -m verl_ext.main`` runs
verl's trainer with the glue that feeds them.

The names below are imported on first access, so importing the package (verl's plugin entry point does, in every
verl process) costs nothing.
"""

import importlib

_EXPORTS = {
    "GroupEntropyHistory": "verl_ext.algos.history",
    "EdgeGrpoConfig": "verl_ext.config",
    "GepoConfig": "verl_ext.config",
    "load_algorithm_config": "verl_ext.config",
}

__all__ = ["EdgeGrpoConfig", "GepoConfig", "GroupEntropyHistory", "load_algorithm_config"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verl_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
