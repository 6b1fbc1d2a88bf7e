"""verl_ext.cpu.sharded_save: on CPU, the model verl's FSDP2 save puts in CPU memory (separate_async's pi_old) is a
copy: restoring it after an in-place optimizer update gives back the saved weights, not the updated ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from verl_ext.cpu.sharded_save import copying_sharded_save


@pytest.fixture
def sharded_model(tmp_path):
    """A two-layer FSDP2 model on a one-rank gloo group (its parameters are DTensors on CPU)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        fully_shard(model)
        yield model
    finally:
        dist.destroy_process_group()


def _update_in_place(model: torch.nn.Module) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.randn(3, 4)).square().sum().backward()
    optimizer.step()


def _local_values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p._local_tensor.detach().clone() for name, p in model.named_parameters()}


def test_restore_after_an_in_place_update_gives_the_saved_weights(sharded_model):
    from verl.utils import fsdp_utils

    saved_values = _local_values(sharded_model)
    state, spec = copying_sharded_save(fsdp_utils.fsdp2_sharded_save_to_cpu)(sharded_model)
    _update_in_place(sharded_model)
    updated = _local_values(sharded_model)
    assert any(not torch.equal(updated[k], saved_values[k]) for k in saved_values)  # the update moved the weights
    fsdp_utils.fsdp2_sharded_load_from_cpu(sharded_model, state, spec)
    restored = _local_values(sharded_model)
    for name, value in saved_values.items():
        assert torch.equal(restored[name], value), name


def test_a_shard_verl_already_copied_is_kept_as_is():
    """Only a shard that is a parameter's own storage is cloned (a GPU save, or a verl that copies, costs nothing)."""
    model = torch.nn.Linear(2, 2)
    copied = {name: (p.detach().clone(), None) for name, p in model.named_parameters()}
    state, _ = copying_sharded_save(lambda m: (copied, "spec"))(model)
    assert all(state[k][0] is copied[k][0] for k in copied)
    aliased, _ = copying_sharded_save(lambda m: ({k: (p.detach(), None) for k, p in m.named_parameters()}, "s"))(model)
    params = dict(model.named_parameters())
    assert all(aliased[k][0].data_ptr() != params[k].data_ptr() for k in params)
    assert all(torch.equal(aliased[k][0], params[k]) for k in params)


def test_wrapping_twice_wraps_once():
    from verl.utils import fsdp_utils

    verl_save = getattr(fsdp_utils.fsdp2_sharded_save_to_cpu, "__wrapped__", fsdp_utils.fsdp2_sharded_save_to_cpu)
    once = copying_sharded_save(verl_save)
    assert copying_sharded_save(once) is once and once.__wrapped__ is verl_save


def test_in_cpu_mode_the_separate_async_worker_saves_with_the_copy():
    """The tests run in CPU mode (tests/conftest.py); importing verl's separate_async worker module rebinds the save in
    verl.utils.fsdp_utils, where DetachActorWorker looks it up when it first saves (only CPU mode installs that hook:
    tests/unit/test_cpu_mode.py)."""
    from verl.experimental.separation import engine_workers
    from verl.utils import fsdp_utils

    from verl_ext.cpu import is_cpu_support_active

    assert is_cpu_support_active()
    assert fsdp_utils.fsdp2_sharded_save_to_cpu.__wrapped__.__module__ == "verl.utils.fsdp_utils"
    worker = engine_workers.DetachActorWorker.__new__(engine_workers.DetachActorWorker)
    worker._strategy_handlers = None
    worker.config = type("Config", (), {"actor": type("Actor", (), {"strategy": "fsdp2"})})()
    assert worker.copy_handler is fsdp_utils.fsdp2_sharded_save_to_cpu  # what verl's worker saves with
