"""What verl's ``verl.plugins`` entry point runs in every process that imports verl: almost nothing, at once.

verl loads this module from ``verl/__init__.py`` in the driver, the TaskRunner, every worker and every agent-loop
worker, and in every verl tool (model merger, data scripts). It imports nothing heavy itself; each registration
runs when the verl module it extends is imported in that process (``verl_ext.import_hooks``):

* ``verl.trainer.ppo.core_algos``: the ``edge_grpo`` and ``gepo`` advantage estimators (``register_adv_est``);
* ``verl.experimental.agent_loop``: the ``gec_agent`` agent loop (verl's ``register``), after the package has run;
* ``verl.workers.config.optimizer``: ``lr_scheduler_type: linear`` for verl's FSDP engine (``verl_ext.lr_schedule``).

So a process that never computes an advantage or runs an agent loop pays for none of them, and every process that
does still has them, without the user importing verl_ext. CPU mode comes first and only with ``VERL_PLATFORM=cpu``
(``verl_ext.cpu``), before verl resolves a device.

Installing verl_ext never breaks verl's own imports: a registration that fails is logged at ERROR (cause named)
where it fires and kept; the registration is then missing in that process, and ``verl_ext.main`` and verl_ext's
trainers stop with ``PluginHookError`` at start-up (``verl_ext.verl_compat.check_plugin_hooks``). The checks of
the verl internals a registered piece relies on run when that piece starts (the ``gec_agent`` loop when it is first
built, the trainers when they start), not in the hooks. verl itself swallows plugin import errors (logged at DEBUG
only), so a failure of this module's own body is logged at ERROR here before verl sees it; ``verl_ext.main`` also
imports this module itself, which makes such a failure fatal there.

Every module imports first in a fresh process: when the import started in the verl_ext module a hook would load
(``import verl_ext.algos.registry`` imports ``core_algos``, whose hook would import the half-run registry), the hook
leaves the registration to that module's own decorators (``import_hooks.module_initializing``).
"""

import logging

from verl_ext.import_hooks import PluginHookError, module_initializing, when_imported

_logger = logging.getLogger(__name__)
_REGISTRY_MODULE = "verl_ext.algos.registry"
_GEC_AGENT_MODULE = "verl_ext.rollout.gec_agent_loop"


def _register_estimators(core_algos) -> None:
    if module_initializing(_REGISTRY_MODULE):  # its import brought core_algos in: its decorators register both
        return
    # importing the module registers both (@register_adv_est); registering again below is a no-op for them
    from verl_ext.algos import registry

    for name, fn in (("edge_grpo", registry.compute_edge_grpo_outcome_advantage),
                     ("gepo", registry.compute_gepo_outcome_advantage)):
        core_algos.register_adv_est(name)(fn)  # idempotent; also a re-executed (reloaded) core_algos gets them


def _register_gec_agent(agent_loop_package) -> None:
    if module_initializing(_GEC_AGENT_MODULE):  # its import brought the package in: its @register registers it
        return
    import importlib

    from verl_ext.names import GEC_AGENT_NAME
    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    # importing the module registers it (@register); registering again is a no-op then
    importlib.import_module(agent_loop_package.__name__ + ".agent_loop").register(GEC_AGENT_NAME)(GecAgentLoop)


def _install_linear_lr(optimizer_module) -> None:
    from verl_ext.lr_schedule import install

    install()  # FSDPOptimizerConfig accepts lr_scheduler_type=linear; the engine is patched when one is built


# verl module -> (what is registered, the registration); each runs right after that module is executed
HOOKS = {
    "verl.trainer.ppo.core_algos": ("register the edge_grpo and gepo advantage estimators", _register_estimators),
    "verl.experimental.agent_loop": ("register the gec_agent agent loop", _register_gec_agent),
    "verl.workers.config.optimizer": ("add lr_scheduler_type=linear to verl's FSDP optimizer config",
                                      _install_linear_lr),
}


def _load() -> None:
    from verl_ext.cpu import activate_cpu_support_if_needed

    activate_cpu_support_if_needed()  # first, and only with VERL_PLATFORM=cpu: before verl resolves a device
    for module_name, (what, hook) in HOOKS.items():
        when_imported(module_name, what, hook)


try:
    _load()
except Exception as _error:  # verl logs plugin errors at DEBUG only: say it here, then re-raise
    if not isinstance(_error, PluginHookError):  # a hook's failure is logged where it fired
        _logger.exception("verl_ext's verl plugin (verl_ext.plugin) failed in this process, so verl runs without "
                          "verl_ext here (edge_grpo, gepo and gec_agent unregistered)")
    raise
