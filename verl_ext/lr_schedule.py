"""``lr_scheduler_type: linear`` for verl's FSDP engine: the linear decay EDGE-GRPO trained with.

EDGE-GRPO's runs use Hugging Face's linear schedule (lr -> 0 over the run, no warm-up; docs/edge-grpo.md).
verl 0.9.1's FSDP optimizer config accepts only ``constant`` and ``cosine`` (``FSDPOptimizerConfig.__post_init__``
asserts it, ``FSDPEngine._build_lr_scheduler`` raises for anything else; Megatron has ``linear`` already).
:func:`install` (run by ``verl_ext.plugin`` in every process that imports ``verl.workers.config.optimizer``, right
after it) adds ``linear`` and changes nothing for any other value:

* ``FSDPOptimizerConfig.__post_init__`` is wrapped: for any value but ``linear`` it is verl's own, called as is;
  for ``linear`` it runs verl's checks with ``constant`` in its place, then puts ``linear`` back;
* only when a ``linear`` config is built -- in a worker that is before its engine builds the scheduler --
  ``FSDPEngine._build_lr_scheduler`` is wrapped to build :func:`linear_lr_factor` for it, and only for such a
  config. The engine module is imported only then (never from the hook, where it may be mid-import), so a process
  that never sees ``linear`` has verl's engine untouched.

A verl whose FSDP config accepts ``linear`` itself (verl 0.9.1's does not) keeps its own: :func:`install` then
changes nothing, so verl's schedule is the one that runs.
"""

from __future__ import annotations

import functools

LINEAR = "linear"
_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"


def linear_lr_factor(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """LR multiplier at ``step``: 0 -> 1 over ``warmup_steps``, then 1 -> ``min_lr_ratio`` at ``total_steps``.

    With ``min_lr_ratio=0`` this is ``transformers.get_linear_schedule_with_warmup``.
    """
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    decay = max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_linear_scheduler(optimizer, optim_config):
    """A ``LambdaLR`` of :func:`linear_lr_factor` from verl's FSDP optimizer config (warm-up read as verl does)."""
    from torch.optim.lr_scheduler import LambdaLR

    total = int(optim_config.total_training_steps)
    warmup = int(optim_config.lr_warmup_steps if optim_config.lr_warmup_steps is not None else -1)
    if warmup <= 0:
        warmup = int(optim_config.lr_warmup_steps_ratio * total)
    min_ratio = float(optim_config.min_lr_ratio or 0.0)
    offset = 0 if getattr(optim_config, "zero_indexed_step", True) else 1

    def factor(step: int) -> float:
        return linear_lr_factor(step + offset, warmup_steps=warmup, total_steps=total, min_lr_ratio=min_ratio)

    return LambdaLR(optimizer, factor)


def _patch_engine() -> None:
    import importlib

    from verl_ext.verl_compat import check_fsdp_engine, require_attrs

    engine_module = importlib.import_module(_ENGINE_MODULE)
    require_attrs(engine_module, "FSDPEngine")
    engine_cls = engine_module.FSDPEngine
    check_fsdp_engine(engine_cls)
    original = engine_cls._build_lr_scheduler
    if getattr(original, "_verl_ext_linear", False):
        return

    @functools.wraps(original)
    def _build_lr_scheduler(self, optimizer):
        if getattr(self.optimizer_config, "lr_scheduler_type", None) == LINEAR:
            return build_linear_scheduler(optimizer, self.optimizer_config)
        return original(self, optimizer)

    _build_lr_scheduler._verl_ext_linear = True
    engine_cls._build_lr_scheduler = _build_lr_scheduler


def verl_has_linear(config_cls) -> bool:
    """Whether verl's own FSDP optimizer config (``config_cls``, not yet wrapped) accepts ``linear``."""
    try:
        config_cls(lr_scheduler_type=LINEAR)
    except (AssertionError, ValueError):  # verl 0.9.1: assert lr_scheduler_type in ["constant", "cosine"]
        return False
    return True


def install() -> None:
    """Teach verl's FSDP optimizer config and engine ``lr_scheduler_type: linear`` unless verl has its own;
    idempotent."""
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    from verl_ext.verl_compat import check_fsdp_optimizer_config

    check_fsdp_optimizer_config()
    original = FSDPOptimizerConfig.__post_init__
    if getattr(original, "_verl_ext_linear", False) or verl_has_linear(FSDPOptimizerConfig):
        return

    @functools.wraps(original)
    def __post_init__(self):
        if self.lr_scheduler_type != LINEAR or self.warmup_style is not None:
            return original(self)
        # verl's own checks with an accepted value, then linear back (lr_scheduler_type is a mutable field)
        self.lr_scheduler_type = "constant"
        original(self)
        self.lr_scheduler_type = LINEAR
        _patch_engine()

    __post_init__._verl_ext_linear = True
    FSDPOptimizerConfig.__post_init__ = __post_init__
