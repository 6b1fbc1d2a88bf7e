"""Embedded toy task for ``python -m verl_ext.main`` on a CPU laptop.

``build_toy_assets()`` returns a :class:`ToyAssets` with a tiny SFT-warmed Qwen2
(``model_path``), verl RL parquets (``train_parquet``/``val_parquet``) and a rule
reward file (``reward_path``/``reward_name``). Everything is built offline in a
few seconds and cached.
"""

from .build import ToyAssets, build_toy_assets, default_cache_dir

__all__ = ["ToyAssets", "build_toy_assets", "default_cache_dir"]
