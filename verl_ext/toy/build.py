"""Build (or reuse) the cached toy assets: tiny Qwen2 + tokenizer, RL parquets, reward file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import model as _model
from . import task as _task

BUILD_VERSION = "2"  # 2: two- and three-operand prompts, greedy validation rows
SEED = 0
REWARD_NAME = "compute_score"
REWARD_PATH = str(Path(__file__).with_name("reward.py").resolve())
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ToyAssets:
    model_path: str  # HF dir: config + model.safetensors + tokenizer + generation_config
    train_parquet: str
    val_parquet: str
    reward_path: str
    reward_name: str = REWARD_NAME
    root: str = ""  # the versioned cache directory holding everything above
    built: bool = False  # True if this call built the assets, False if they came from the cache
    stats: dict = field(default_factory=dict, compare=False)  # warm-up metrics measured at build time


def default_cache_dir() -> Path:
    env = os.environ.get("VERL_EXT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/verl_ext/toy").expanduser()


def _fingerprint() -> str:
    spec = {
        "v": BUILD_VERSION,
        "seed": SEED,
        "model": _model.MODEL_KW,
        "sft": [_model.SFT_LR, _model.SFT_BATCH, _model.SFT_MAX_STEPS, _model.SFT_TARGET_ACC, _model.SFT_EVAL_EVERY],
        "split": [_task.SPLIT_SEED, _task.N_VAL_ONE_DIGIT, _task.N_TRAIN_TWO_DIGIT, _task.N_VAL_TWO_DIGIT,
                  _task.VAL_SAMPLES],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def _assets_for(root: Path, built: bool, stats: dict) -> ToyAssets:
    return ToyAssets(
        model_path=str(root / "model"),
        train_parquet=str(root / "train.parquet"),
        val_parquet=str(root / "val.parquet"),
        reward_path=REWARD_PATH,
        reward_name=REWARD_NAME,
        root=str(root),
        built=built,
        stats=stats,
    )


def _is_complete(root: Path) -> bool:
    return (root / _MANIFEST).is_file() and (root / "model" / "model.safetensors").is_file() \
        and (root / "train.parquet").is_file() and (root / "val.parquet").is_file()


def _build_into(out: Path, verbose: bool) -> dict:
    import torch

    from .tokenizer import save_tokenizer

    t0 = time.time()
    model_dir = out / "model"
    model_dir.mkdir(parents=True)
    tok = save_tokenizer(model_dir)

    sp = _task.split_prompts()
    ex = {k: [(_task.prompt_text(*t), str(sum(t))) for t in v] for k, v in sp.items()}

    with torch.random.fork_rng(devices=[]):
        model = _model.create_model(tok, seed=SEED)
        sft = _model.sft_warmup(model, tok, ex["train_one"], seed=SEED)
    evals = {k: _model.evaluate(model, tok, v) for k, v in ex.items()}

    model.save_pretrained(str(model_dir), safe_serialization=True)
    _model.generation_config(tok).save_pretrained(str(model_dir))

    train_rows, val_rows = _task.make_rows()
    _task.write_parquet(train_rows, str(out / "train.parquet"))
    _task.write_parquet(val_rows, str(out / "val.parquet"))

    n_two = sum(r["data_source"] == _task.DATA_SOURCE_TWO for r in train_rows)
    stats = {
        "fingerprint": _fingerprint(),
        "build_seconds": round(time.time() - t0, 2),
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "n_train": len(train_rows),
        "n_train_two_digit": n_two,
        "n_val": len(val_rows),  # each held-out prompt VAL_SAMPLES times sampled, once greedy
        "sft": sft,
        "eval": evals,
    }
    with open(out / _MANIFEST, "w") as f:
        json.dump(stats, f, indent=2)
    if verbose:
        print(f"[verl_ext.toy] built in {stats['build_seconds']} s: " + summarize(stats))
    return stats


def summarize(stats: dict) -> str:
    ev = stats.get("eval", {})
    parts = []
    for k in ("train_one", "val_one", "train_two", "val_two"):
        e = ev.get(k)
        if e and e.get("n"):
            parts.append(f"{k}: acc@T1={e['acc_t1']:.3f} greedy={e['acc_greedy']:.3f} H1={e['entropy_first']:.2f}")
    return "; ".join(parts)


def build_toy_assets(cache_dir: str | os.PathLike | None = None, force: bool = False, verbose: bool = True) -> ToyAssets:
    """Build the toy assets once and cache them; later calls return the cached paths.

    ``cache_dir`` defaults to ``$VERL_EXT_CACHE`` or ``~/.cache/verl_ext/toy``. The assets
    live in a subdirectory named after a fingerprint of the build settings, so changing
    the recipe rebuilds automatically. ``force=True`` rebuilds unconditionally.
    Safe against concurrent builders: each builds in a private temp dir and renames it.
    """
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / f"toy-{_fingerprint()}"

    if not force and _is_complete(root):
        with open(root / _MANIFEST) as f:
            stats = json.load(f)
        return _assets_for(root, built=False, stats=stats)

    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=str(base)))
    try:
        stats = _build_into(tmp, verbose=verbose)
        if root.exists():
            if not force and _is_complete(root):  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
                with open(root / _MANIFEST) as f:
                    return _assets_for(root, built=False, stats=json.load(f))
            old = base / f".old-{root.name}-{os.getpid()}-{time.time_ns()}"
            os.replace(root, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _assets_for(root, built=True, stats=stats)
