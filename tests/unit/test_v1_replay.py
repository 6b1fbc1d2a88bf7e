"""verl_ext's settings of verl's v1 replay buffer (``verl_ext.trainer.v1_replay``): prompts and rows in the data's order
and the poll interval, through verl's own ``ReplayBuffer.sample`` and ``PPOTrainer._build_replay_buffer``."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("transfer_queue")

from verl.trainer.ppo.v1 import replay_buffer
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

from verl_ext.config import ConfigError
from verl_ext.run_checks import check_v1_sampler
from verl_ext.trainer import v1
from verl_ext.trainer.v1_replay import data_order_class, ordered_uid, sampler_settings


def test_sampler_settings():
    assert sampler_settings(None) == ({"data_order": False, "poll_interval": None}, [])
    assert sampler_settings({"data_order": True, "poll_interval": 0.05, "foo": 1}) == (
        {"data_order": True, "poll_interval": 0.05}, ["foo"])
    for bad in ({"data_order": "yes"}, {"poll_interval": 0}, {"poll_interval": True}, {"poll_interval": "1"}):
        with pytest.raises(ValueError, match=f"sampler_kwargs.{next(iter(bad))}="):
            sampler_settings(bad)


def test_start_up_check_refuses_bad_values_and_leaves_custom_samplers_alone():
    def config(sampler_kwargs, custom=None, use_v1=True):
        return OmegaConf.create({"trainer": {"use_v1": use_v1, "v1": {"sampler": {
            "custom_sampler": {"path": custom, "name": custom and "Mine"}, "sampler_kwargs": sampler_kwargs}}}})

    with pytest.raises(ConfigError, match="poll_interval=-1"):
        check_v1_sampler(config({"poll_interval": -1}), None)
    check_v1_sampler(config({"poll_interval": -1}, custom="mine.py"), None)  # the custom sampler's own kwargs
    check_v1_sampler(config({"poll_interval": -1}, use_v1=False), None)  # the legacy trainer has no replay buffer
    check_v1_sampler(config({"data_order": True, "poll_interval": 0.05}), None)


def test_ordered_uids_sort_in_fetch_order():
    uids = [ordered_uid(n, f"{s:x}") for n, s in zip((0, 9, 10, 123456), (99, 1, 50, 2))]
    assert sorted(uids) == uids and all("_" not in u for u in uids)
    with pytest.raises(ValueError):
        ordered_uid(1, "a_b")


class FakeQueue:
    """What ``ReplayBuffer.sample`` reads of TransferQueue: ``kv_list`` in the order keys were put, and ``kv_clear``."""

    def __init__(self, items):
        self.items = items

    def kv_list(self):
        return {"train": dict(self.items)}

    def kv_clear(self, partition_id, keys):
        pass


def _finished_step(monkeypatch):
    """Three prompts of one step, put in data order (u1, u2, u3 = fetch order), whose trajectories finished in another
    order (TransferQueue lists them as they came)."""
    uids = [ordered_uid(n, h) for n, h in ((1, "f0"), (2, "0a"), (3, "77"))]
    items = [(u, {"is_prompt": True, "status": "finished", "global_steps": 4}) for u in uids]
    finished = [(2, 1), (0, 0), (2, 0), (1, 1), (0, 1), (1, 0)]  # (prompt, session) as they finished
    items += [(f"{uids[p]}_{s}_0", {"status": "success", "global_steps": 4}) for p, s in finished]
    monkeypatch.setattr(replay_buffer, "tq", FakeQueue(items))
    return uids


@pytest.mark.parametrize("base", [replay_buffer.ReplayBuffer, replay_buffer.ReplayBufferAsync])
def test_data_order_buffer_takes_prompts_and_rows_in_data_order(monkeypatch, base):
    uids = _finished_step(monkeypatch)
    kwargs = dict(trainer_mode="sync" if base is replay_buffer.ReplayBuffer else "colocate_async",
                  trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop", sampler_kwargs={})
    batch, _ = data_order_class(base)(**kwargs).sample(global_steps=4, partition_id="train", batch_size=3)
    assert batch.keys == [f"{u}_{s}_0" for u in uids for s in (0, 1)]  # verl's legacy row order
    verl_batch, _ = base(**kwargs).sample(global_steps=4, partition_id="train", batch_size=3)
    assert verl_batch.keys != batch.keys and sorted(verl_batch.keys) == sorted(batch.keys)  # verl's: as they finished


def _trainer(mode="sync", sampler_kwargs=None, filter_groups=False):
    cls = v1.extended_trainer_cls(get_trainer_cls(mode))
    trainer = cls.__new__(cls)
    trainer.trainer_mode = mode
    trainer.config = OmegaConf.create({
        "trainer": {"v1": {mode: {}, "sampler": {
            "max_off_policy_threshold": None, "max_off_policy_strategy": "drop", "sync_refill_failed_groups": False,
            "custom_sampler": {"path": None, "name": None}, "sampler_kwargs": sampler_kwargs or {}}}},
        "algorithm": {"filter_groups": {"enable": filter_groups, "metric": "acc", "max_num_gen_batches": 0}},
        "reward": {"reward_model": {"enable": False, "enable_resource_pool": False}},
        "data": {"train_batch_size": 2, "gen_batch_size": None},
    })
    trainer._add_prompts_to_generate = lambda n: None
    return trainer


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_trainer_builds_verls_buffer_with_data_order_and_poll_interval(mode):
    verl_cls = replay_buffer.ReplayBuffer if mode == "sync" else replay_buffer.ReplayBufferAsync
    plain = _trainer(mode)._build_replay_buffer()
    assert type(plain) is verl_cls and plain.poll_interval == 2.0
    ordered = _trainer(mode, {"data_order": True, "poll_interval": 0.05}, filter_groups=True)._build_replay_buffer()
    assert type(ordered) is data_order_class(verl_cls) and ordered.poll_interval == 0.05
    assert ordered.filter_groups_metric == "acc"  # verl's own kwargs still reach it (a custom sampler gets none)


def test_data_order_names_training_prompts_in_fetch_order():
    trainer = _trainer("sync", {"data_order": True})
    trainer._build_replay_buffer()
    trainer.train_dataloader = [{"raw_prompt": np.array(["a", "b", "c"], dtype=object), "index": np.arange(3)}] * 2
    trainer.train_dataloader_it = None
    uids = [u for _ in range(2) for u in trainer._fetch_one_gen_batch()["uid"]]
    assert len(set(uids)) == 6 and sorted(uids) == uids
    assert [int(u.split("-")[0]) for u in uids] == list(range(6))
    plain = _trainer("sync")
    plain._build_replay_buffer()
    plain.train_dataloader, plain.train_dataloader_it = trainer.train_dataloader, None
    assert "-" in plain._fetch_one_gen_batch()["uid"][0] and not plain._fetch_one_gen_batch()["uid"][0][:12].isdigit()
