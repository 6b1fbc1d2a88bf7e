"""CPU fix: verl's FSDP2 save of the model to CPU memory keeps a copy, not the parameters themselves.

verl's ``separate_async`` trainer (and its fully async one) keeps pi_old for the mini-batches after the first of a
sync cycle with ``save_model_to_cpu`` / ``restore_model_from_cpu``
(``verl/experimental/separation/engine_workers.py``, ``DetachActorWorker``). Its FSDP2 handler,
``verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu``, stores ``param._local_tensor.detach().cpu()``: on an accelerator
a copy, on CPU the parameter's own storage (``.cpu()`` of a CPU tensor returns it). The optimizer then updates that
storage in place, and the "restored" pi_old is the current policy: the later mini-batches are scored with the
weights being trained (``actor/ppo_kl`` 0, and a rollout-vs-actor difference of ~1e-2 instead of ~1e-6).

In CPU mode (only), when verl's ``DetachActorWorker`` module is imported, verl's function is wrapped so that every
saved shard that shares storage with a parameter is cloned. ``DetachActorWorker`` imports the function from
``verl.utils.fsdp_utils`` when it first saves, so rebinding it there is what verl calls
(guard: ``verl_ext.verl_compat.check_cpu_sharded_save``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from verl_ext.import_hooks import when_imported

DETACH_WORKER_MODULE = "verl.experimental.separation.engine_workers"
_PATCHED_ATTR = "_verl_ext_cpu_patched"


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _local(param: torch.Tensor) -> torch.Tensor:
    return getattr(param, "_local_tensor", param)  # a DTensor's shard on this rank, or the tensor itself


def copying_sharded_save(save: Callable) -> Callable:
    """``save(model) -> (state, spec)``, where ``state`` maps a parameter name to ``(shard, spec)``, with each shard
    that is a parameter's own storage replaced by a clone."""
    if getattr(save, _PATCHED_ATTR, False):
        return save

    def fsdp2_sharded_save_to_cpu(model: torch.nn.Module):
        state, global_spec = save(model)
        live = {_storage(_local(p)) for p in model.parameters()}
        copied = {name: (shard.clone() if _storage(shard) in live else shard, spec)
                  for name, (shard, spec) in state.items()}
        return copied, global_spec

    fsdp2_sharded_save_to_cpu.__wrapped__ = save
    setattr(fsdp2_sharded_save_to_cpu, _PATCHED_ATTR, True)
    return fsdp2_sharded_save_to_cpu


def _wrap_sharded_save(detach_worker_module: ModuleType) -> None:
    from verl.utils import fsdp_utils

    from verl_ext.verl_compat import check_cpu_sharded_save

    check_cpu_sharded_save()
    fsdp_utils.fsdp2_sharded_save_to_cpu = copying_sharded_save(fsdp_utils.fsdp2_sharded_save_to_cpu)


def install_sharded_save_copy() -> None:
    """Wrap verl's FSDP2 save to CPU when ``DetachActorWorker``'s module is imported (now if it is); CPU mode only."""
    when_imported(DETACH_WORKER_MODULE, "make verl's FSDP2 save to CPU memory keep a copy (separate_async's pi_old)",
                  _wrap_sharded_save)
