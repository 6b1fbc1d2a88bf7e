"""Settings verl accepts that cannot give a correct run on CPU: refused at start-up, naming the key (docs/cpu.md).

Ulysses sequence parallelism (``ulysses_sequence_parallel_size > 1``). verl slices each sequence across the ranks of
a sequence-parallel group and puts its all-to-all exchange, which gives every rank's attention the whole sequence,
inside the flash-attention forward only (``verl.models.transformers.monkey_patch.apply_monkey_patch`` replaces
``_flash_attention_forward`` with ``_ulysses_flash_attention_forward``). flash-attn does not run on CPU; the CPU model
uses ``attn_implementation=sdpa``, which verl does not patch, so each rank would attend only to its own slice of the
sequence: the log-probs, entropies and gradients would silently be those of another model.
"""

from __future__ import annotations

from typing import Any

# verl 0.9.1's keys (the fsdp_config copies follow the top-level ones in verl's ActorConfig/CriticConfig)
ULYSSES_KEYS = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
    "critic.ulysses_sequence_parallel_size",
    "critic.fsdp.ulysses_sequence_parallel_size",
)
# the attention implementation whose forward verl's Ulysses patch replaces
ULYSSES_ATTENTION = "flash_attention_2"


def _select(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        if node is None or not hasattr(node, "get"):
            return None
        node = node.get(part, None)
    return node


def check_cpu_run_config(config: Any) -> None:
    """Raise ``ConfigError`` for a setting that cannot give a correct run in CPU mode (call only in CPU mode)."""
    from verl_ext.config import ConfigError

    for key in ULYSSES_KEYS:
        size = _select(config, key)
        if size is not None and int(size) > 1:
            raise ConfigError(
                f"{key}={int(size)}: Ulysses sequence parallelism cannot run on CPU. verl exchanges the sequence "
                f"slices inside the {ULYSSES_ATTENTION} forward only, which does not run on CPU; with the CPU model's "
                f"sdpa attention each rank would attend only to its own slice of every sequence. Set {key}=1")
