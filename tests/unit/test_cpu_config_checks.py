"""verl_ext.cpu.config_checks: Ulysses sequence parallelism cannot run on CPU, shown on verl's own patch, and refused
at start-up naming the key."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.config import ConfigError
from verl_ext.cpu.config_checks import ULYSSES_KEYS, check_cpu_run_config


def _tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"  # the CPU model's attention (hydra_configs/toy_cpu.yaml)
    return Qwen2ForCausalLM(config).eval()


def _log_probs(model, ids, positions):
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=positions).logits[:, :-1]
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_verls_ulysses_patch_leaves_the_cpu_models_attention_local_to_each_rank(monkeypatch):
    """verl's Ulysses exchange lives in the flash-attention forward it patches; the sdpa attention a CPU run uses is
    left as it is, so a rank holding the second half of a sequence attends to that half only, and scores it
    differently from the whole sequence."""
    from transformers.integrations import flash_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from verl.models.transformers.monkey_patch import _ulysses_flash_attention_forward, apply_monkey_patch

    monkeypatch.setattr(flash_attention, "_flash_attention_forward", flash_attention._flash_attention_forward)
    model = _tiny_qwen2()
    apply_monkey_patch(model, ulysses_sp_size=2)
    assert flash_attention._flash_attention_forward is _ulysses_flash_attention_forward  # Ulysses: flash only
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward  # the CPU model's attention: not exchanged

    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(16)[None]
    whole = _log_probs(model, ids, positions)[:, 8:]  # tokens 9..15 scored on the whole sequence
    rank_1 = _log_probs(model, ids[:, 8:], positions[:, 8:])  # rank 1 of 2: its slice (tokens 8..15), its positions
    assert (whole - rank_1).abs().max() > 1e-2


@pytest.mark.parametrize("key", ULYSSES_KEYS)
def test_ulysses_is_refused_on_cpu_naming_the_key(key):
    config = OmegaConf.create({})
    OmegaConf.update(config, key, 2, force_add=True)
    with pytest.raises(ConfigError, match=rf"{key}=2: Ulysses sequence parallelism cannot run on CPU.*Set {key}=1"):
        check_cpu_run_config(config)


def test_no_sequence_parallelism_passes():
    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 1,
                                                               "fsdp_config": {"ulysses_sequence_parallel_size": 1}},
                                                     "ref": {"ulysses_sequence_parallel_size": 1}},
                               "critic": {"ulysses_sequence_parallel_size": 1}})
    check_cpu_run_config(config)
    check_cpu_run_config(OmegaConf.create({}))


def test_verl_exts_task_runners_refuse_it_in_cpu_mode_only(monkeypatch):
    from verl_ext import cpu
    from verl_ext.trainer.runner import check_platform_settings

    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 2}}})
    monkeypatch.setattr(cpu, "_ACTIVE", False)
    check_platform_settings(config)  # a GPU run: verl's Ulysses
    monkeypatch.setattr(cpu, "_ACTIVE", True)
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"):
        check_platform_settings(config)


def test_the_main_job_refuses_it_before_ray_starts():
    """``python -m verl_ext.main`` (and its dry run) checks the CPU settings with the rest of its start-up checks."""
    from verl_ext.dry_run import compose_run_config
    from verl_ext.main import prepare

    config = compose_run_config("toy_cpu", ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"):
        prepare(config, [])
