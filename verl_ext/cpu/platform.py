"""A "cpu" platform for verl 0.9.1's platform registry, plus the two fixes verl needs to train on CPU.

verl 0.9.1's platform registry (``verl.plugin.platform.platform_manager``) holds only ``nvidia``, ``huawei`` and
``amd``; on a machine without an accelerator it falls back to ``nvidia`` and later dies in NCCL. This module adds
:class:`PlatformCPU` (name ``"cpu"``, backend ``gloo``) and two small wrappers (see :func:`apply_verl_fixes`).

Nothing here runs by itself: :func:`verl_ext.cpu.activate_cpu_support_if_needed` decides whether CPU mode is on.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

CPU_PLATFORM_NAME = "cpu"


def _mem_info() -> tuple[int, int]:
    """(free, total) bytes of host RAM, for callers of ``torch.cuda.mem_get_info``."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except Exception:  # psutil is a ray dependency, but stay safe
        return 0, 0


def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs) -> int:
    return 0


class _CPUDeviceModule(ModuleType):
    """Stand-in for ``torch.cuda`` returned by ``get_torch_device()``.

    verl calls ``get_torch_device().<fn>`` in ~80 places (empty_cache, synchronize, memory stats, rng state, streams).
    ``torch.cpu`` covers streams/synchronize/device_count; the rest are no-ops, zeros, or the global CPU RNG.
    ``is_available()`` is False on purpose: verl's memory helpers (``utils/memory_utils.py``) and
    ``DataProto.load_from_disk`` use it to skip accelerator-only work.
    """

    def __init__(self):
        super().__init__("verl_ext_cpu_device")
        self.empty_cache = _noop
        self.ipc_collect = _noop
        self.set_per_process_memory_fraction = _noop
        self.reset_peak_memory_stats = _noop
        self.memory_allocated = _zero
        self.memory_reserved = _zero
        self.max_memory_allocated = _zero
        self.max_memory_reserved = _zero
        self.mem_get_info = lambda *a, **k: _mem_info()
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        self.manual_seed = lambda seed: torch.manual_seed(seed)
        self.manual_seed_all = lambda seed: torch.manual_seed(seed)
        self.get_device_name = lambda *a, **k: "cpu"
        self.is_available = lambda: False
        self.current_device = lambda: "cpu"
        self.set_device = _noop
        self.synchronize = _noop

    def __getattr__(self, name: str) -> Any:
        # Stream, Event, current_stream, stream, device_count, ... come from torch.cpu.
        return getattr(torch.cpu, name)


_DEVICE_MODULE = _CPUDeviceModule()


@PlatformRegistry.register(platform=CPU_PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for plain CPUs: ``gloo`` collectives, no accelerator.

    ``current_device()`` returns ``"cpu"`` (not an int) because verl uses ``get_device_id()`` as a ``.to()`` /
    ``device_id=`` target (e.g. ``FSDPEngine.get_per_tensor_param_shard``, ``fsdp_utils.load_fsdp_model_to_gpu``).
    ``ray_resource_name()`` stays ``"GPU"``: verl asks Ray for ``{"GPU": 1}`` bundles per worker
    (``RayResourcePool.get_placement_groups``), so run Ray with logical GPUs, e.g. ``+ray_kwargs.ray_init.num_gpus=1``;
    torch never sees CUDA.
    """

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never win verl's auto-detection loop (it probes registered platforms in order and the first available
        # one wins); CPU mode is chosen explicitly through VERL_PLATFORM=cpu by activate_cpu_support_if_needed().
        return False

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the logical GPUs it hands out; harmless on a CPU build of torch.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# ---------------------------------------------------------------------------------------------------------------
# The two verl fixes (docs/cpu.md). Both wrap, neither edits site-packages.
# ---------------------------------------------------------------------------------------------------------------

_PATCHED_ATTR = "_verl_ext_cpu_patched"


def _gloo_process_group_wrapper(orig):
    """Wrap ``verl.utils.distributed.initialize_global_process_group_ray``.

    Why: it builds ``backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``,
    which on the cpu platform is ``"cpu:gloo,cpu:gloo"`` and torch raises
    ``ValueError: Duplicate device type cpu in backend string``. Passing ``backend="gloo"`` when the caller gave
    none avoids it; explicit backends (e.g. ``CheckpointEngineWorker.__init__`` passes ``"cpu:gloo"``) are kept.
    """
    if getattr(orig, _PATCHED_ATTR, False):
        return orig

    @functools.wraps(orig)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return orig(timeout_second=timeout_second, backend=backend or "gloo")

    setattr(initialize_global_process_group_ray, _PATCHED_ATTR, True)
    return initialize_global_process_group_ray


def apply_verl_fixes() -> None:
    """Apply the two CPU fixes. Idempotent; only called when CPU mode is active.

    1. gloo backend string: wrap ``initialize_global_process_group_ray`` (see ``_gloo_process_group_wrapper``).
       ``verl.workers.engine_workers`` imports the function by name, so the wrapper is also put there if that
       module is already loaded (normally it is not yet: plugins load at the end of ``import verl``).
    2. engine selection: FSDP engines are registered only for ``device=["cuda", "npu"]``
       (``FSDPEngineWithLMHead``, ``FSDPEngineWithValueHead``) and the lookup (``EngineRegistry.get_engine_cls``)
       uses ``get_device_name()`` = "cpu", giving ``ValueError: No engine registered for device='cpu'``.
       verl's own override env ``VERL_ENGINE_DEVICE=cuda``, read by that lookup, changes only which engine
       *class* is picked; the engine then places tensors with ``get_device_id()`` = "cpu".
    """
    import verl.utils.distributed as dist_mod

    dist_mod.initialize_global_process_group_ray = _gloo_process_group_wrapper(
        dist_mod.initialize_global_process_group_ray
    )
    ew = sys.modules.get("verl.workers.engine_workers")
    if ew is not None and hasattr(ew, "initialize_global_process_group_ray"):
        ew.initialize_global_process_group_ray = _gloo_process_group_wrapper(ew.initialize_global_process_group_ray)

    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")


def install_cpu_platform() -> None:
    """Make ``get_platform()`` return :class:`PlatformCPU` in this process (and in processes it spawns).

    ``VERL_PLATFORM=cpu`` is what verl's ``_detect_platform_name`` reads on first use; it is exported so Ray
    workers started from this process agree. If something already resolved the platform singleton (it normally
    has not: plugins load before any ``get_platform()`` call), it is replaced.
    """
    os.environ["VERL_PLATFORM"] = CPU_PLATFORM_NAME
    from verl.plugin.platform import platform_manager

    current = platform_manager._current_platform
    if current is not None and not isinstance(current, PlatformCPU):
        platform_manager.set_platform(PlatformCPU())


from verl_ext.cpu import activate_cpu_support_if_needed, finish_deferred_registration  # noqa: E402

# CPU mode was asked for while this module, imported first, was importing verl: turn it on now
finish_deferred_registration(__name__, activate_cpu_support_if_needed)
