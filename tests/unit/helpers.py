import numpy as np
import torch


def outcome_batch(rewards, lengths, width=None):
    """(R, M) for responses with scalar rewards placed on their last valid token."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    lengths = torch.as_tensor(lengths)
    width = width or max(int(lengths.max()), 1)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(len(rewards), width)
    last = (lengths - 1).clamp(min=0)
    token_rewards[torch.arange(len(rewards)), last] = rewards * (lengths > 0).float()
    return token_rewards, mask


def uids(*group_sizes):
    return np.array([f"g{g}" for g, n in enumerate(group_sizes) for _ in range(n)], dtype=object)


class FakeTransferQueue:
    """TransferQueue's calls that verl's v1 trainer steps (padding, old log-probs, advantages) and verl_ext's v1 glue
    make, on an in-memory store: per-key rows in, verl's ``list_of_dict_to_tensordict`` layout out, as the real client
    returns them."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from verl.trainer.ppo.v1 import trainer_base  # verl's v1 modules: imported by the tests that use this only

        for i, key in enumerate(keys):
            row = self.rows.setdefault(key, {})
            if fields is not None:
                item = fields[i]
                row.update({name: item[name] for name in fields.keys()})
            if tags is not None:
                self.tags[key] = dict(tags[i])
        return trainer_base.KVBatchMeta(keys=list(keys), tags=[self.tags.get(k, {}) for k in keys],
                                        partition_id=partition_id)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = [self.rows[k] for k in keys]
        names = list(rows[0]) if select_fields is None else [f for f in select_fields if f in rows[0]]
        for name in names:
            assert all(name in r for r in rows), f"field {name} not ready in every row"
        return list_of_dict_to_tensordict([{name: r[name] for name in names} for r in rows])
