"""lr_scheduler_type=linear for verl's FSDP engine (EDGE-GRPO's HF linear decay), through verl's own classes."""

import types

import pytest
import torch

import verl_ext.plugin  # noqa: F401  (installs the linear schedule, as verl's plugin entry point does)
from verl_ext.lr_schedule import linear_lr_factor


def test_linear_factor_is_hf_linear_schedule():
    # transformers.get_linear_schedule_with_warmup: no warm-up -> 1 at step 0, 0 at the last step
    assert [linear_lr_factor(s, warmup_steps=0, total_steps=4) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert linear_lr_factor(10, warmup_steps=0, total_steps=4) == 0.0
    assert [linear_lr_factor(s, warmup_steps=2, total_steps=6) for s in range(4)] == [0.0, 0.5, 1.0, 0.75]
    assert linear_lr_factor(4, warmup_steps=0, total_steps=4, min_lr_ratio=0.1) == pytest.approx(0.1)


def _optim_config(**overrides):
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    values = dict(lr=1e-6, lr_scheduler_type="linear", total_training_steps=4, lr_warmup_steps=0, weight_decay=0.0)
    values.update(overrides)
    return FSDPOptimizerConfig(**values)


def test_verl_fsdp_engine_builds_linear_decay():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    config = _optim_config()
    assert config.lr_scheduler_type == "linear"
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=config.lr)
    engine = types.SimpleNamespace(optimizer_config=config, rank=1)
    scheduler = FSDPEngine._build_lr_scheduler(engine, optimizer)
    lrs = []
    for _ in range(5):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1e-6, 0.75e-6, 0.5e-6, 0.25e-6, 0.0])
    # verl's own schedules are untouched
    cosine = _optim_config(lr_scheduler_type="cosine")
    optimizer = torch.optim.AdamW([param], lr=cosine.lr)
    FSDPEngine._build_lr_scheduler(types.SimpleNamespace(optimizer_config=cosine, rank=1), optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-6)


def test_unknown_schedule_still_rejected_by_verl():
    with pytest.raises(AssertionError):
        _optim_config(lr_scheduler_type="exponential")


def test_a_verl_with_its_own_linear_keeps_it(monkeypatch):
    """Should verl's FSDP config accept ``linear`` itself, install() leaves verl's config and engine as they are."""
    from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimizerConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from verl_ext import lr_schedule

    def __post_init__(self):  # a later verl's: linear among its own schedules
        assert self.lr_scheduler_type in ["constant", "cosine", "linear"]
        OptimizerConfig.__post_init__(self)

    def _build_lr_scheduler(self, optimizer):
        return "verl's linear"

    monkeypatch.setattr(FSDPOptimizerConfig, "__post_init__", __post_init__)
    monkeypatch.setattr(FSDPEngine, "_build_lr_scheduler", _build_lr_scheduler)
    lr_schedule.install()
    assert FSDPOptimizerConfig.__post_init__ is __post_init__
    config = _optim_config()
    assert FSDPEngine._build_lr_scheduler is _build_lr_scheduler
    assert FSDPEngine._build_lr_scheduler(types.SimpleNamespace(optimizer_config=config, rank=1), None) == (
        "verl's linear")
