"""CPU fix: FSDP2's ``CPUOffloadPolicy(pin_memory=True)`` without an accelerator.

verl builds every forward-only FSDP2 engine (the reference model of ``actor.use_kl_loss`` / ``use_kl_in_reward``)
with ``CPUOffloadPolicy(pin_memory=True)`` (``workers/engine/fsdp/transformer_impl.py:462``), and pinning host
memory needs an accelerator: ``RuntimeError: Cannot access accelerator device when none is available``.  On a
CPU-only machine the "offload" is a no-op move anyway, so the policy is kept and only the pinning is dropped.
"""

from __future__ import annotations


def unpin_cpu_offload_policy() -> None:
    """Make ``CPUOffloadPolicy`` never pin memory in this process (CPU mode only; idempotent)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    if getattr(CPUOffloadPolicy.__init__, "_verl_ext_unpinned", False):
        return
    verl_init = CPUOffloadPolicy.__init__

    def init(self, pin_memory: bool = True):
        verl_init(self, pin_memory=False)

    init._verl_ext_unpinned = True
    CPUOffloadPolicy.__init__ = init
