"""Build (or reuse) the cached toy assets: tiny Qwen2 + tokenizer, RL parquets, reward file.

Three tasks. Two reasoning tasks (``reason.py``: step-by-step additions with a marked final answer, three data
sources; their cells ``designs.REASON_TASKS``): ``chain5_unsolved``, the default, whose hard split is five-digit chains
its warmed-up model does not solve, and ``chain6``, the first reasoning toy, whose hard split is six-digit chains the
warm-up never shows. And ``add`` (the first toy, ``task.py``: one- and two-digit sums answered at once). The builds
are deterministic on one machine: a fixed seed, a single-threaded warm-up of a fixed length (the reasoning tasks;
``add`` keeps its accuracy-target stop), and the manifest records the weights' sha256 next to the build's step-0
figures.

The reasoning tasks' warmed-up weights ship in the package (``weights/<task>-<fingerprint>.safetensors``, 1.3 MB
for ``chain5_unsolved``, 364 KB for ``chain6``, with the record of the build that made them and, for a selecting
design, the hard split it picked): a build for that fingerprint copies them instead of warming up, so every machine
starts from the same bits, whatever its CPU rounds differently. ``from_scratch=True`` (``python -m verl_ext.toy
--from-scratch``) runs the warm-up (and the pick, ``select_unsolved``) instead; a changed recipe (another
fingerprint) always does.

The runtime: ``python -m verl_ext.main`` builds the toy through this module, which reads the specs (``designs.py``),
the model (``model.py``) and the task data (``reason.py``, ``task.py``, ``tokenizer.py``); it never imports the
research tools (``sft_control.py``, ``search.py``), which import it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import designs
from . import model as _model
from . import reason as _reason
from . import task as _task
from .designs import REASON_TASKS, SEED

BUILD_VERSION = "2"  # add task -- 2: two- and three-operand prompts, greedy validation rows
REASON_VERSION = "1"
TASKS = (*REASON_TASKS, "add")  # the reasoning toys (designs.REASON_TASKS), then the first toy
DEFAULT_TASK = "chain5_unsolved"
REWARD_NAME = "compute_score"
_REASON_REWARD = str(Path(__file__).with_name("reason_reward.py").resolve())
REWARD_PATHS = {"add": str(Path(__file__).with_name("reward.py").resolve()),
                **dict.fromkeys(REASON_TASKS, _REASON_REWARD)}
REWARD_PATH = REWARD_PATHS["add"]
# each task's data sources: what ``toy.train_sources`` (``train_sources=``) may name
TASK_SOURCES = {"chain5_unsolved": (_reason.DATA_SOURCE_CHAIN, _reason.DATA_SOURCE_BAG, "toy_chain5"),
                "chain6": _reason.DATA_SOURCES,
                "add": (_task.DATA_SOURCE_ONE, _task.DATA_SOURCE_TWO)}
TRAIN_SOURCES_KEY = "toy.train_sources"
_MANIFEST = "manifest.json"
EVAL_MAX_TOKENS = 64
SELECT_CHUNK = 500  # candidates tried at once when a design picks its hard split
SHIPPED_DIR = Path(__file__).with_name("weights")


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


def _fingerprint(task: str = DEFAULT_TASK) -> str:
    if task in REASON_TASKS and task != "chain6":
        from dataclasses import asdict

        cell = designs.reason_cell(task)
        spec = {"task": task, "v": REASON_VERSION, "seed": SEED, "model": cell.model_kw, "sft": cell.recipe,
                "design": asdict(cell.design), "candidates": designs.N_CANDIDATES,
                "split": [_reason.SPLIT_SEED, _reason.N_VAL, designs.N_TRAIN_HARD, _reason.VAL_SAMPLES]}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    if task == "chain6":  # "reason", its name when it was the default: kept, so its fingerprint stays c65dfcf2a4
        spec = {"task": "reason", "v": REASON_VERSION, "seed": SEED, "model": designs.MODEL_KW,
                "sft": designs.REASON_SFT,
                "split": [_reason.SPLIT_SEED, _reason.N_VAL, _reason.N_TRAIN, _reason.VAL_SAMPLES]}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    spec = {
        "v": BUILD_VERSION,
        "seed": SEED,
        "model": designs.MODEL_KW,
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
        reward_path=REWARD_PATHS[stats.get("task", "add")],
        reward_name=REWARD_NAME,
        root=str(root),
        built=built,
        stats=stats,
    )


def _is_complete(root: Path) -> bool:
    return (root / _MANIFEST).is_file() and (root / "model" / "model.safetensors").is_file() \
        and (root / "train.parquet").is_file() and (root / "val.parquet").is_file()


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """sha256 of the saved ``model.safetensors`` (two builds of one recipe on one machine give the same)."""
    h = hashlib.sha256()
    with open(Path(model_dir) / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu_signature() -> str:
    """The CPU model and a hash of its feature flags: two machines with the same signature run the same kernels."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not flags:
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    return f"{model} / flags {hashlib.sha256(flags.encode()).hexdigest()[:8]}"


def shipped_weights(task: str = DEFAULT_TASK) -> tuple[Path, dict] | None:
    """The packaged weights of ``task``'s current recipe and the record of the build that made them, or None."""
    stem = SHIPPED_DIR / f"{task}-{_fingerprint(task)}"
    weights, record = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    if not (weights.is_file() and record.is_file()):
        return None
    with open(record) as f:
        return weights, json.load(f)


def ship_weights(assets: ToyAssets) -> Path:
    """Write a from-scratch build's weights and record into the package (``SHIPPED_DIR``), for a changed recipe."""
    stats = assets.stats
    if stats.get("weights_source") != "warm-up":
        raise ValueError("ship the weights of a from-scratch build (python -m verl_ext.toy --from-scratch --ship)")
    SHIPPED_DIR.mkdir(exist_ok=True)
    stem = SHIPPED_DIR / f"{stats['task']}-{stats['fingerprint']}"
    shutil.copyfile(Path(assets.model_path) / "model.safetensors", stem.with_suffix(".safetensors"))
    keep = ("task", "fingerprint", "weights_sha256", "n_params", "vocab_size", "sft", "step0", "cpu", "design",
            "selection", "hard_split")
    with open(stem.with_suffix(".json"), "w") as f:
        json.dump({k: stats[k] for k in keep if k in stats}, f, indent=2)
        f.write("\n")
    return stem.with_suffix(".safetensors")


def reason_step0_figures(model, tok, split, seed: int = SEED, group_samples: int = 0,
                         n_val: int | None = None) -> dict:
    """Per data source of ``split`` (its order), on the held-out prompts: sampled (T = 1) and greedy accuracy, median
    response length (tokens, EOS included), mean token entropy (nats), the shares of sampled replies that use the cue
    and that are empty (EOS first), and the repair rate: accuracy of a T = 1 continuation after a wrong attempt + the
    cue.

    ``group_samples`` = k > 0 adds, from k more T = 1 samples of each prompt (validation's ``mean@1`` over k samples):
    ``acc_group`` (their accuracy), ``all_wrong_groups`` (share of prompts none of whose k samples is right),
    ``median_len_group`` and ``entropy_group``, and ``ref_median_len``: the median length of the prompts' reference
    solutions (tokens, EOS included). ``n_val``: the first n held-out prompts only (a smoke test's)."""
    import random
    import statistics

    rng = random.Random(seed + 7)
    figures = {}
    for source in split.val:
        ops = split.val[source][:n_val]
        prompts = [_reason.prompt_text(source, o) for o in ops]
        truth = [str(_reason.answer(o)) for o in ops]
        sampled = _model.sample_responses(model, tok, prompts, EVAL_MAX_TOKENS, 1.0, seed=seed + 1)
        greedy = _model.sample_responses(model, tok, prompts, EVAL_MAX_TOKENS, 0.0, seed=seed + 2)
        wrong = [_reason.wrong_attempt(source, o, rng) + _reason.CUE for o in ops]
        repaired = _model.sample_responses(model, tok, prompts, EVAL_MAX_TOKENS, 1.0, seed=seed + 3, prefixes=wrong)

        def acc(outs, prefixes=None, truth=truth):
            pre = prefixes or [""] * len(outs)
            return round(sum(_reason.final_answer(p + o["text"]) == t for p, o, t in zip(pre, outs, truth))
                         / len(outs), 4)

        figures[source] = {
            "n": len(ops),
            "acc_t1": acc(sampled),
            "acc_greedy": acc(greedy),
            "median_len": statistics.median(o["n_tokens"] for o in sampled),
            "entropy": round(statistics.fmean(o["entropy"] for o in sampled), 4),
            "cue_rate": round(sum(_reason.CUE in o["text"] for o in sampled) / len(sampled), 4),
            "empty_rate": round(sum(o["n_tokens"] <= 1 for o in sampled) / len(sampled), 4),  # EOS first
            "repair_t1": acc(repaired, wrong),
        }
        if group_samples:
            k = group_samples
            group = _model.sample_responses(model, tok, [p for p in prompts for _ in range(k)], EVAL_MAX_TOKENS, 1.0,
                                            seed=seed + 4)
            right = [_reason.final_answer(o["text"]) == truth[i // k] for i, o in enumerate(group)]
            refs = [len(tok.encode(_reason.solution(source, o), add_special_tokens=False)) + 1 for o in ops]
            figures[source].update({
                "group_samples": k,
                "acc_group": round(sum(right) / len(right), 4),
                "all_wrong_groups": round(sum(not any(right[i * k:(i + 1) * k]) for i in range(len(ops))) / len(ops), 4),
                "median_len_group": statistics.median(o["n_tokens"] for o in group),
                "entropy_group": round(statistics.fmean(o["entropy"] for o in group), 4),
                "ref_median_len": statistics.median(refs),
            })
    return figures


def reason_departures(model, tok, split, samples: int = _reason.VAL_SAMPLES, seed: int = SEED) -> dict:
    """Per left-to-right data source of ``split`` (not ``toy_bag``, whose order is free), on the held-out prompts,
    ``samples`` T = 1 replies each: where they first leave the reference solution (``reason.first_departure``).

    Returns:
        ``{source: {"attempts": n, "after_<k>": replies that wrote k running totals first, ..., "whole": replies
        that are the whole solution}}``.
    """
    out = {}
    for source in split.val:
        if source == _reason.DATA_SOURCE_BAG:
            continue
        ops = split.val[source]
        prompts = [_reason.prompt_text(source, o) for o in ops for _ in range(samples)]
        replies = _model.sample_responses(model, tok, prompts, EVAL_MAX_TOKENS, 1.0, seed=seed + 5)
        counts: dict[str, int] = {}
        for i, reply in enumerate(replies):
            o = ops[i // samples]
            k = _reason.first_departure(source, o, reply["text"])
            key = "whole" if k > _reason.n_steps(source, o) else f"after_{k}"
            counts[key] = counts.get(key, 0) + 1
        out[source] = {"attempts": len(replies), **dict(sorted(counts.items()))}
    return out


def reason_split(task: str, stats: dict | None = None):
    """A reasoning task's split (``reason.Split``): its design's, with the hard split its build picked (``stats``:
    the build's manifest or the packaged record, which hold it as ``hard_split``) for a selecting design."""
    design = designs.reason_cell(task).design
    if not design.unsolved_of:
        return designs.split_for(design)
    chosen = (stats or {}).get("hard_split")
    if chosen is None:
        raise ValueError(f"toy task {task!r}: its hard split is picked by its build; no build record holds it")
    return designs.split_for(design, chosen=chosen)


def warm_up(cell, tok, device: str = "cpu") -> tuple:
    """A reasoning cell's model (``designs.reason_cell``, ``designs.parse_cell``) warmed up from scratch on its
    design's warm-up examples with its recipe, seeded with ``SEED``: (the model, the warm-up's record)."""
    split = designs.split_for(cell.design, warmup_only=True)
    examples = designs.warmup_examples(cell.design, split, cell.recipe)
    model = _model.create_model(tok, seed=SEED, model_kw=cell.model_kw).to(device)
    sft = _model.sft_warmup_steps(model, tok, examples, seed=SEED, steps=cell.recipe["steps"], lr=cell.recipe["lr"],
                                  batch_size=cell.recipe["batch"])
    return model, sft


def select_unsolved(model, tok, design: designs.HardDesign, seed: int, limit: int | None = None) -> dict:
    """A selecting design's hard split: its candidates in order, kept when the greedy reply is wrong and so is each of
    ``design.unsolved_of`` T = 1 samples (the held-out figures' budget), until ``N_VAL`` held-out and
    ``N_TRAIN_HARD`` RL prompts are found. Returns them with the share of candidates kept. ``limit``: try only the
    first ``limit`` candidates (a multiple of ``SELECT_CHUNK``) and return what they give: a check of a pick's start."""
    k, want_val = design.unsolved_of, _reason.N_VAL
    want = want_val + designs.N_TRAIN_HARD
    candidates = designs.hard_candidates(design)[:limit]
    kept, tried = [], 0
    def right(ops, text):
        return _reason.final_answer(text) == str(_reason.answer(ops))

    while len(kept) < want and tried < len(candidates):
        chunk = candidates[tried:tried + SELECT_CHUNK]
        greedy = _model.sample_responses(model, tok, [_reason.prompt_text(design.source, o) for o in chunk],
                                         EVAL_MAX_TOKENS, 0.0, seed=0)
        chunk = [o for o, g in zip(chunk, greedy) if not right(o, g["text"])]
        prompts = [_reason.prompt_text(design.source, o) for o in chunk for _ in range(k)]
        outs = _model.sample_responses(model, tok, prompts, EVAL_MAX_TOKENS, 1.0, seed=seed * 1_000_003 + tried) \
            if chunk else []
        kept += [ops for i, ops in enumerate(chunk) if not any(right(ops, o["text"]) for o in outs[i * k:(i + 1) * k])]
        tried += SELECT_CHUNK
    if len(kept) < want and limit is None:
        raise ValueError(f"{design.name}: only {len(kept)} of {len(candidates)} candidates unsolved in {k} samples "
                         f"({want} needed): the warm-up solves this family too well for a hard split")
    tried = min(tried, len(candidates))
    share = round(len(kept) / tried, 4)
    kept = kept[:want]
    return {"val": sorted(kept[:want_val]), "train": sorted(kept[want_val:]), "tried": tried,
            "unsolved_share": share, "samples": k}


def _build_reason_into(out: Path, verbose: bool, from_scratch: bool = False, task: str = DEFAULT_TASK) -> dict:
    import torch

    from .tokenizer import save_tokenizer

    t0 = time.time()
    model_dir = out / "model"
    model_dir.mkdir(parents=True)
    tok = save_tokenizer(model_dir)
    cell = designs.reason_cell(task)
    design = cell.design
    shipped = None if from_scratch else shipped_weights(task)
    extra = {} if task == "chain6" else {"design": REASON_TASKS[task]}
    with torch.random.fork_rng(devices=[]):
        if shipped is None:
            model, sft = warm_up(cell, tok)
        else:
            model = _model.create_model(tok, seed=SEED, model_kw=cell.model_kw)
        model.save_pretrained(str(model_dir), safe_serialization=True)  # config.json (+ the weights, replaced next)
        if shipped is not None:
            shutil.copyfile(shipped[0], model_dir / "model.safetensors")
            if weights_sha256(model_dir) != shipped[1]["weights_sha256"]:
                raise RuntimeError(f"the packaged toy weights {shipped[0]} do not match their record's sha256")
        gen = _model.generation_config(tok)
        gen.max_new_tokens = EVAL_MAX_TOKENS
        gen.save_pretrained(str(model_dir))
        if shipped is None:
            n_threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with torch.no_grad():
                    if design.unsolved_of:
                        selection = select_unsolved(model, tok, design, SEED)
                        extra["hard_split"] = {k: selection[k] for k in ("val", "train")}
                        extra["selection"] = {k: v for k, v in selection.items() if k not in ("val", "train")}
                    split = reason_split(task, extra)
                    figures = reason_step0_figures(model, tok, split)
            finally:
                torch.set_num_threads(n_threads)
        else:
            extra.update({k: shipped[1][k] for k in ("hard_split", "selection") if k in shipped[1]})
            split = reason_split(task, extra)

    train_rows, val_rows = _reason.make_rows(split=split)
    _task.write_parquet(train_rows, str(out / "train.parquet"))
    _task.write_parquet(val_rows, str(out / "val.parquet"))
    n_train = {s: sum(r["data_source"] == s for r in train_rows) for s in TASK_SOURCES[task]}
    if shipped is not None:  # the figures and warm-up record of the build that made the packaged weights
        record = shipped[1]
        return _write_manifest(out, task, model, tok, t0, verbose, sft=record["sft"], val_rows=val_rows,
                               n_train=n_train, step0=record["step0"], weights_source="shipped",
                               cpu=record.get("cpu"), **extra)
    return _write_manifest(out, task, model, tok, t0, verbose, sft=sft, val_rows=val_rows, n_train=n_train,
                           step0=figures, weights_source="warm-up", cpu=cpu_signature(), **extra)


def _write_manifest(out: Path, task: str, model, tok, t0: float, verbose: bool, sft: dict, val_rows: list,
                    **figures) -> dict:
    """The build's record (``manifest.json``): task, fingerprint, weights hash, sizes, warm-up and step-0 figures."""
    model_dir = out / "model"
    stats = {
        "task": task,
        "fingerprint": _fingerprint(task),
        "weights_sha256": weights_sha256(model_dir),
        "build_seconds": round(time.time() - t0, 2),
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "n_val": len(val_rows),  # each held-out prompt VAL_SAMPLES times sampled, once greedy
        "sft": sft,
        **figures,
    }
    with open(out / _MANIFEST, "w") as f:
        json.dump(stats, f, indent=2)
    if verbose:
        print(f"[verl_ext.toy] built in {stats['build_seconds']} s: " + summarize(stats))
    return stats


def _build_into(out: Path, verbose: bool, task: str = "add", from_scratch: bool = False) -> dict:
    if task in REASON_TASKS:
        return _build_reason_into(out, verbose, from_scratch, task)
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
    return _write_manifest(out, "add", model, tok, t0, verbose, sft=sft, val_rows=val_rows,
                           n_train=len(train_rows), n_train_two_digit=n_two, eval=evals)


def summarize(stats: dict) -> str:
    """One line: the toy's task, fingerprint, weights hash and step-0 figures."""
    head = f"task={stats.get('task', 'add')} fingerprint={stats.get('fingerprint')} " \
           f"weights={str(stats.get('weights_sha256', '?'))[:12]}"
    if stats.get("weights_source"):
        head += f" ({stats['weights_source']})"
    if "step0" in stats:
        parts = [f"{s}: acc@T1={e['acc_t1']:.3f} greedy={e['acc_greedy']:.3f} len={e['median_len']} "
                 f"H={e['entropy']:.3f} repair={e['repair_t1']:.3f}" for s, e in stats["step0"].items()]
        return head + " | step 0: " + "; ".join(parts)
    ev = stats.get("eval", {})
    parts = []
    for k in ("train_one", "val_one", "train_two", "val_two"):
        e = ev.get(k)
        if e and e.get("n"):
            parts.append(f"{k}: acc@T1={e['acc_t1']:.3f} greedy={e['acc_greedy']:.3f} H1={e['entropy_first']:.2f}")
    return head + " | " + "; ".join(parts)


def check_train_sources(sources, task: str = DEFAULT_TASK) -> tuple[str, ...] | None:
    """``toy.train_sources`` checked: the data sources the RL training parquet keeps, in the task's own order, or
    None for all of them (the default, and a list naming all of them: the default parquet itself).

    A single name counts as a one-item list; an empty list, a name that is not one of ``task``'s data sources
    (``TASK_SOURCES``: the default's ``toy_chain``, ``toy_bag``, ``toy_chain5``; chain6's ``toy_chain6`` last) or a
    name given twice is a
    ``ConfigError`` naming the key. The validation set is never filtered.
    """
    from verl_ext.config import ConfigError

    if sources is None:
        return None
    if task not in TASK_SOURCES:
        raise ConfigError(f"toy task {task!r}: must be one of {list(TASK_SOURCES)}")
    allowed = TASK_SOURCES[task]
    if isinstance(sources, str):
        sources = [sources]
    try:
        names = list(sources)
    except TypeError:
        raise ConfigError(f"{TRAIN_SOURCES_KEY}={sources!r} is invalid: a list of data sources among "
                          f"{list(allowed)}") from None
    if not names:
        raise ConfigError(f"{TRAIN_SOURCES_KEY}=[] is invalid: name at least one data source among {list(allowed)} "
                          f"(leave the key out to train on all of them)")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ConfigError(f"{TRAIN_SOURCES_KEY}={names!r} is invalid: {unknown} not a data source of the toy task "
                          f"{task!r}; must be among {list(allowed)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{TRAIN_SOURCES_KEY}={names!r} is invalid: {twice} named twice")
    if set(names) == set(allowed):
        return None
    return tuple(s for s in allowed if s in names)


def train_parquet_for(assets: ToyAssets, sources: tuple[str, ...] | None) -> str:
    """The training parquet that holds only ``sources`` (checked by :func:`check_train_sources`): the same rows per
    source as the full RL pool, in the same order (the full pool filtered, so fewer rows overall), written once
    next to it as ``train-<source>+<source>.parquet``. None: the full pool's own file, unchanged."""
    if sources is None:
        return assets.train_parquet
    task = assets.stats.get("task", "add")
    path = Path(assets.root) / f"train-{'+'.join(sources)}.parquet"
    if not path.is_file():
        rows, _ = _reason.make_rows(split=reason_split(task, assets.stats)) if task in REASON_TASKS \
            else _task.make_rows()
        kept = [r for r in rows if r["data_source"] in sources]
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{time.time_ns()}")
        try:
            _task.write_parquet(kept, str(tmp))
            os.replace(tmp, path)  # concurrent builders (multirun jobs) each write their own file, then rename
        finally:
            tmp.unlink(missing_ok=True)
    return str(path)


def build_toy_assets(cache_dir: str | os.PathLike | None = None, force: bool = False, verbose: bool = True,
                     task: str = DEFAULT_TASK, from_scratch: bool = False, train_sources=None) -> ToyAssets:
    """Build the toy assets of ``task`` (``TASKS``: "chain5_unsolved", the default, "chain6" or "add") once and cache them; later calls return
    the cached paths.

    ``cache_dir`` defaults to ``$VERL_EXT_CACHE`` or ``~/.cache/verl_ext/toy``. The assets
    live in a subdirectory named after a fingerprint of the build settings, so changing
    the recipe rebuilds automatically. ``force=True`` rebuilds unconditionally.
    ``from_scratch=True`` (implies ``force``) warms a reasoning task's model up instead of copying the packaged weights.
    ``train_sources`` (``toy.train_sources`` in the toy config; default None: all the task's data sources) keeps only
    those data sources in ``train_parquet``, the same rows per source as the full pool (:func:`train_parquet_for`);
    ``val_parquet`` always holds every data source.
    Safe against concurrent builders: each builds in a private temp dir and renames it.
    """
    force = force or from_scratch
    if task not in TASKS:
        raise ValueError(f"toy task {task!r}: must be one of {list(TASKS)}")
    sources = check_train_sources(train_sources, task)
    assets = _build_or_reuse(cache_dir, force, verbose, task, from_scratch)
    if sources is None:
        return assets
    return replace(assets, train_parquet=train_parquet_for(assets, sources))


def _reused(root: Path) -> ToyAssets:
    """The assets of a complete build already in the cache."""
    with open(root / _MANIFEST) as f:
        return _assets_for(root, built=False, stats=json.load(f))


def _build_or_reuse(cache_dir, force: bool, verbose: bool, task: str, from_scratch: bool) -> ToyAssets:
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    root = base / (f"toy-{_fingerprint(task)}" if task == "add" else f"toy-{task}-{_fingerprint(task)}")

    if not force and _is_complete(root):
        return _reused(root)

    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=str(base)))
    try:
        stats = _build_into(tmp, verbose=verbose, task=task, from_scratch=from_scratch)
        if root.exists():
            if not force and _is_complete(root):  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return _reused(root)
            old = base / f".old-{root.name}-{os.getpid()}-{time.time_ns()}"
            os.replace(root, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, root)
        except OSError:  # another process renamed its build into place since the check above
            if force or not _is_complete(root):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return _reused(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _assets_for(root, built=True, stats=stats)
