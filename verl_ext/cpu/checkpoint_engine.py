"""``cpu`` checkpoint engine: actor -> standalone rollout weights through Ray's object store, for CPU-only machines.

verl's v1 ``separate_async`` trainer refuses the ``naive`` engine (it only serves rollouts in the actor's own
process) and its other engines need CUDA/RDMA (nccl, nixl, mooncake, ...).  This one needs nothing but Ray:

    actor_rollout_ref.rollout.checkpoint_engine.backend=cpu

Per update (verl's ``CheckpointEngineManager.update_weights``): ``build_topology`` names a fresh session; every actor
rank walks the weight generator (gathering full tensors is collective under FSDP), the master rank (actor rank 0)
copies them to CPU, ``ray.put``s the list once and leaves the reference in a named mailbox actor; every rollout
worker awaits that reference and yields the tensors to its server adapter; ``finalize`` empties the session.
Registered by ``verl_ext.cpu`` only in CPU mode, when a process imports verl's checkpoint-engine registry.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from verl_ext.cpu import finish_deferred_registration
from verl_ext.verl_compat import check_cpu_checkpoint_engine

BACKEND = "cpu"
_MAILBOX = "verl_ext_cpu_checkpoint_mailbox"


class _Mailbox:
    """One slot per update session: the sender's object reference, awaited by the receivers."""

    def __init__(self):
        self._payloads: dict[str, Any] = {}
        self._ready: dict[str, asyncio.Event] = {}

    def _event(self, session: str) -> asyncio.Event:
        return self._ready.setdefault(session, asyncio.Event())

    async def put(self, session: str, payload) -> None:
        self._payloads[session] = payload
        self._event(session).set()

    async def get(self, session: str):
        await self._event(session).wait()
        return self._payloads[session]

    async def drop(self, session: str) -> None:
        self._payloads.pop(session, None)
        self._ready.pop(session, None)


_handle = None


def _mailbox():
    global _handle
    if _handle is None:  # one per Ray job, created by whichever process asks first
        _handle = ray.remote(_Mailbox).options(name=_MAILBOX, get_if_exists=True, num_cpus=0,
                                                max_concurrency=1000).remote()
    return _handle


async def _items(weights):
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


@CheckpointEngineRegistry.register(BACKEND)
class CPUCheckpointEngine(CheckpointEngine):
    """Weights as one Ray object per update; the receivers fetch it from the object store."""

    def __init__(self, bucket_size: int = 0, is_master: bool = False, **_unused) -> None:
        self.is_master = is_master
        self.session: str | None = None
        self.role: str | None = None

    def prepare(self) -> dict:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        session = uuid.uuid4().hex
        actor = {"session": [session] * actor_wg_world_size, "role": ["actor"] * actor_wg_world_size}
        rollout = {"session": [session] * rollout_world_size, "role": ["rollout"] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, session: str, role: str) -> None:
        self.session, self.role = session, role

    def finalize(self) -> None:
        if self.is_master and self.role == "actor" and self.session is not None:
            _mailbox().drop.remote(self.session)  # fire and forget: every receiver has its copy by now
        self.session = None

    async def send_weights(self, weights, global_steps: int | None = None):
        named = []
        async for name, tensor in _items(weights):
            if self.is_master:
                named.append((name, tensor.detach().to("cpu", copy=True).contiguous()))
        if self.is_master:
            # a list around the reference: Ray passes nested references through instead of resolving them
            await _mailbox().put.remote(self.session, [ray.put(named)])
        return {}

    async def receive_weights(self, global_steps: int | None = None):
        (ref,) = await _mailbox().get.remote(self.session)
        named: list[tuple[str, torch.Tensor]] = await ref
        for name, tensor in named:
            yield name, tensor


def register_cpu_checkpoint_engine() -> None:
    """Importing this module registers the engine; this is the explicit, idempotent entry point."""
    check_cpu_checkpoint_engine()
    CheckpointEngineRegistry.register(BACKEND)(CPUCheckpointEngine)


finish_deferred_registration(__name__, register_cpu_checkpoint_engine)  # CPU mode came on while this module imported verl
