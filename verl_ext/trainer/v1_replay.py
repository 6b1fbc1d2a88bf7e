"""verl's v1 replay buffers, made repeatable and quick to poll (``trainer.v1.sampler.sampler_kwargs``).

verl's v1 ``sync`` trainer submits a step's prompts to its agent loops and takes the finished groups from its replay
buffer (``verl.trainer.ppo.v1.replay_buffer``). Two of the buffer's choices change between two runs of one config
and seed, and one costs time on a small model:

* the prompts of a step are taken in ``sorted(sampleable uids, key=global_steps)`` order over a ``set`` of fresh
  ``uuid4`` strings, so ties (every prompt of a ``sync`` step) fall in an order that changes from run to run;
* a taken group's trajectories enter the batch in the order TransferQueue lists them, the order they finished;
* it looks for finished groups every ``poll_interval`` = 2 s, idle time where a step of a tiny model takes ~2 s.

With ``data_order: true`` the buffer takes prompts by (step, uid) and orders a batch's rows by (uid, session, output),
and verl_ext's v1 trainer names each training prompt ``<fetch number>-<uuid4>`` (:func:`ordered_uid`), so the uid
order is the order the dataloader gave the prompts: the row order of verl's legacy trainer. With a smaller
``poll_interval`` (seconds) the buffer looks more often. Both are off by default (verl's behaviour); the embedded CPU
default turns them on (``hydra_configs/toy_cpu.yaml``). What else a seeded v1 run needs to repeat (each request named
by its sample, not by the order requests arrive) is ``gec_agent``'s (``verl_ext.rollout.gec_agent_loop``).

Only in ``sync`` mode is the set of groups a step trains fixed by the data: the async modes train the groups that
finish first, which timing decides.
"""

from __future__ import annotations

import functools
from typing import Any

# the keys of ``trainer.v1.sampler.sampler_kwargs`` verl_ext reads when no custom sampler is set, and their defaults
SAMPLER_DEFAULTS = {"data_order": False, "poll_interval": None}  # poll_interval None: verl's own (2.0 s)


def has_custom_sampler(sampler_config: Any) -> bool:
    """Whether ``trainer.v1.sampler`` names a custom sampler (verl's own test in ``_build_replay_buffer``)."""
    custom = (sampler_config or {}).get("custom_sampler", None)
    return bool(custom is not None and custom.get("path") and custom.get("name"))


def sampler_settings(sampler_kwargs: Any) -> tuple[dict, list[str]]:
    """verl_ext's settings of verl's built-in replay buffer, from ``trainer.v1.sampler.sampler_kwargs``.

    Args:
        sampler_kwargs: the mapping (DictConfig or dict; None: empty).

    Returns:
        ``{"data_order": bool, "poll_interval": float | None}``, and the keys verl_ext does not read (verl's
        built-in buffers ignore them too).

    Raises:
        ValueError: a non-boolean ``data_order`` or a ``poll_interval`` that is not a number > 0.
    """
    given = dict(sampler_kwargs or {})
    unknown = sorted(set(given) - set(SAMPLER_DEFAULTS))
    settings = {**SAMPLER_DEFAULTS, **{k: v for k, v in given.items() if k in SAMPLER_DEFAULTS}}
    if not isinstance(settings["data_order"], bool):
        raise ValueError(f"trainer.v1.sampler.sampler_kwargs.data_order={settings['data_order']!r} is invalid: "
                         "must be true or false")
    interval = settings["poll_interval"]
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float))
                                 or not interval > 0):
        raise ValueError(f"trainer.v1.sampler.sampler_kwargs.poll_interval={interval!r} is invalid: must be null "
                         "(verl's 2 s) or a number of seconds > 0")
    return settings, unknown


def ordered_uid(fetch_number: int, suffix: str) -> str:
    """A training prompt's uid whose string order is the order it was fetched: ``<fetch_number, 12 digits>-<suffix>``.

    ``suffix`` (a fresh uuid4's hex) keeps uids unique across a resume, where the count starts again; it has no
    ``_`` (verl splits TransferQueue keys ``{uid}_{session}_{index}`` at ``_``).
    """
    if "_" in suffix:
        raise ValueError(f"a uid suffix may not contain '_': {suffix!r}")
    return f"{fetch_number:012d}-{suffix}"


def trajectory_order(key: str) -> tuple[str, int, int]:
    """The sort key of a TransferQueue trajectory key ``{uid}_{session}_{index}``: (uid, session, index)."""
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


def prompt_order(prompt_global_steps: dict[str, int]):
    """The sort key of a prompt uid: (the step it was submitted at, its uid)."""
    return lambda uid: (prompt_global_steps.get(uid, 0), uid)


class DataOrderMixin:
    """Takes prompts by (step, uid) and lays a batch's trajectories out by (uid, session, output)."""

    def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int):
        prompt_global_steps_snapshot = dict(self.prompt_global_steps[partition_id])
        partition_snapshot = dict(self.partitions[partition_id])
        ordered_keys = sorted(sampleable_keys, key=prompt_order(prompt_global_steps_snapshot))
        return ordered_keys[:batch_size], partition_snapshot, prompt_global_steps_snapshot

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict):
        ordered = dict(sorted(partition_snapshot.items(), key=lambda item: trajectory_order(item[0])))
        return super()._materialize_batch(partition_id, selected_prompt_uids, ordered)


@functools.cache
def data_order_class(base: type) -> type:
    """``base`` (verl's ``ReplayBuffer`` or ``ReplayBufferAsync``) with :class:`DataOrderMixin`."""
    return type(f"DataOrder{base.__name__}", (DataOrderMixin, base), {"__module__": __name__})
