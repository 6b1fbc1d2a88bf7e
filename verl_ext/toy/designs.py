"""Hard-split designs of the reasoning toy (``reason.py``): what the hard split asks and what the warm-up shows of it.

The easy families (``toy_chain``, ``toy_bag``) are the default toy's in every design: the same held-out, RL and
warm-up prompts. A design replaces the hard split (its held-out and RL prompts, ``N_VAL`` and 600 of them) and may
add a family to the warm-up (``warmup_source``, a share ``warmup_share`` of the warm-up examples, written left to
right as ``toy_chain``'s, a fifth of them a wrong attempt + cue + solution as the others):

* ``chain6``      -- the first reasoning toy (``+toy=chain6``): six digits left to right (``toy_chain6``), never in
  the warm-up. Hard by an unseen length: the control.
* ``chain6_seen`` -- the same hard split (the same ``toy_chain6`` prompts), and other six-digit chains in the
  warm-up at a small share, so the model learns to stop by the prompt: hard by the long carry chain at a length the
  warm-up covers.
* ``twodigit``    -- ``toy_chain2d``: 3 or 4 terms, at least two of them two-digit (10-99), the rest digits
  (``47+8+63=`` -> ``47+8=55+63=118#118``): carries and running totals past 100 at about the easy family's length;
  the warm-up shows other prompts of the same kind at a small share (the format, rarely the content).
* ``twodigit3``   -- ``toy_chain2d3``: three two-digit terms (``47+63+29=``); the warm-up shows prompts with exactly
  one two-digit term among 3 or 4 (``toy_chain2d1``, never in the RL pool): every step's format is known, adding two
  two-digit numbers is not.

Designs that pick their hard split with the warm-up model (``unsolved_of`` = k > 0), as DeepScaleR-hard-1k was
picked (the problems a model rarely solves): the warm-up shows a family at a real share, and the hard split is the
held-out prompts of that family that the warmed-up model solves in none of k samples (``build.select_unsolved``);
hard by whatever the model gets wrong, at a length and format the warm-up covers:

* ``chain5_unsolved``   -- five digits left to right (``toy_chain5``), a fifth of the warm-up: learnt well (94% of
  its candidates solved at 329k parameters), so its unsolved ones are the family's rare failures.
* ``twodigit_unsolved`` -- ``toy_chain2d``'s prompts, 30% of the warm-up.

``split_for(design)`` is ``reason.split_problems()`` itself for ``chain6``, so that design is the first reasoning toy
(``+toy=chain6``), draw for draw.

A cell (``parse_cell``: ``DESIGN[@SHARE]/SIZE[:key=value,...]``) is a design, a model size and a warm-up recipe
(``REASON_SFT`` unless the spec overrides it). Each reasoning toy is a cell (``REASON_TASKS``, ``reason_cell``) with
its RL learning rate (``TASK_LR``, which the toy's configs read through ``${verl_ext_toy:rl_lr}``). The build
(``build.py``) and the research tools (``sft_control.py``, ``search.py``) read them here.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace

from . import reason, tokenizer

CHAIN2D = "toy_chain2d"
CHAIN2D3 = "toy_chain2d3"
CHAIN2D1 = "toy_chain2d1"  # warm-up only (twodigit3)
CHAIN5 = "toy_chain5"
N_CANDIDATES = 12000  # held-out prompts a selecting design picks its hard split from (the rest go to the warm-up)
N_TRAIN_HARD = reason.N_TRAIN[reason.DATA_SOURCE_LONG]  # 600: the RL pool's hard share stays 20%
POOL_DRAWS = 6000  # candidate prompts drawn per generated family (deduplicated)
# The toy's Qwen2: the first toy's and chain6's size; a cell's size (``model_kw``) overrides its first five keys.
# Head size 32 (2 query heads, 1 KV head): vLLM's CPU attention supports head sizes 32, 64, 80, ... but not 16, so
# the same model serves the `hf` and the `vllm` rollout backends (same parameter count as 4 heads / 2 KV heads of 16).
MODEL_KW = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
SEED = 0  # the builds' seed: the model's initialisation, the warm-up's examples and batches, the hard split's pick

# The reasoning task's warm-up: a fixed number of steps (the same toy on every run of a machine, whatever its speed).
# mix_bag: share of toy_bag among the warm-up examples (the rest toy_chain); fix: share of wrong-attempt + cue +
# correct-solution examples (loss on the cue and the solution only), which teaches what follows the cue.
REASON_SFT = {"steps": 1000, "lr": 4e-3, "batch": 64, "examples": 8000, "mix_bag": 0.5, "fix": 0.2}
# The reasoning toys as cells (``parse_cell``). ``chain5_unsolved``, the default, is the design search's pick:
# five-digit chains the warmed-up model does not solve; ``chain6`` the first design, hard by an unseen length
# (docs/toy.md).
REASON_TASKS = {"chain5_unsolved": "chain5_unsolved@0.05/h128l2:unsolved_of=32", "chain6": "chain6/h64l2"}
# Each toy task's RL learning rate (actor.optim.lr): hydra_configs/toy_cpu.yaml and toy/*.yaml read it as
# ${verl_ext_toy:rl_lr} (the default toy's) and ${verl_ext_toy:rl_lr,chain6}. The default toy's is the design
# search's pick: supervised steps on the hard split's solutions alone keep toy_chain within 0.05 at 2e-5 (at 2e-4 they
# cost it 0.6); at chain6's, 1e-3 (the first toy's: its 1-2 token answers take it) breaks that model's 19-token
# solutions within 3 steps, with or without GEC.
TASK_LR = {"chain5_unsolved": 2e-5, "chain6": 2e-4, "add": 1e-3}
RECIPE_KEYS = {"steps": int, "lr": float, "batch": int, "examples": int, "mix_bag": float, "fix": float}
CONTROL_KEYS = {"rl_lr": float}  # the RL run's learning rate, which the search's controls mirror
DESIGN_KEYS = {"unsolved_of": int}  # a selecting design's samples per candidate


@dataclass(frozen=True)
class HardDesign:
    name: str
    source: str  # the hard split's data source
    warmup_source: str | None = None  # a family the warm-up shows beside toy_chain and toy_bag
    warmup_share: float = 0.0  # its share of the warm-up examples
    unsolved_of: int = 0  # k > 0: the hard split is the candidates the warmed-up model solves in none of k samples

    @property
    def label(self) -> str:
        """The name, with the share when it is not the design's default (``twodigit@0.02``)."""
        default = DESIGNS.get(self.name)
        label = self.name if default and self.warmup_share == default.warmup_share else \
            f"{self.name}@{self.warmup_share:g}"
        return label if not default or self.unsolved_of == default.unsolved_of else f"{label}(k={self.unsolved_of})"

    def with_share(self, share: float) -> HardDesign:
        if self.warmup_source is None and share:
            raise ValueError(f"design {self.name!r} shows nothing of its hard split in the warm-up: no share to set")
        if not 0.0 <= share < 1.0:
            raise ValueError(f"warm-up share {share} must be in [0, 1)")
        return HardDesign(self.name, self.source, self.warmup_source, share, self.unsolved_of)

    def with_unsolved_of(self, k: int) -> HardDesign:
        if not self.unsolved_of:
            raise ValueError(f"design {self.name!r} does not pick its hard split with the model: no k to set")
        if k < 1:
            raise ValueError(f"unsolved_of={k}: at least one sample")
        return HardDesign(self.name, self.source, self.warmup_source, self.warmup_share, k)


DESIGNS = {d.name: d for d in (
    HardDesign("chain6", reason.DATA_SOURCE_LONG),
    HardDesign("chain6_seen", reason.DATA_SOURCE_LONG, reason.DATA_SOURCE_LONG, 0.05),
    HardDesign("twodigit", CHAIN2D, CHAIN2D, 0.05),
    HardDesign("twodigit3", CHAIN2D3, CHAIN2D1, 0.10),
    HardDesign("chain5_unsolved", CHAIN5, CHAIN5, 0.20, unsolved_of=16),
    HardDesign("twodigit_unsolved", CHAIN2D, CHAIN2D, 0.30, unsolved_of=16),
)}
FIXED_DESIGNS = {n: d for n, d in DESIGNS.items() if not d.unsolved_of}  # hard split known before any model


def parse_design(spec: str) -> HardDesign:
    """``NAME`` or ``NAME@SHARE`` (``twodigit@0.02``)."""
    name, _, share = spec.partition("@")
    if name not in DESIGNS:
        raise ValueError(f"unknown hard-split design {name!r}: one of {list(DESIGNS)}")
    return DESIGNS[name] if not share else DESIGNS[name].with_share(float(share))


def _twodigit(rng: random.Random) -> tuple[int, ...]:
    while True:
        ops = tuple(rng.randrange(10, 100) if rng.random() < 0.5 else rng.randrange(10)
                    for _ in range(rng.choice((3, 4))))
        if sum(x >= 10 for x in ops) >= 2:
            return ops


def _twodigit3(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(10, 100) for _ in range(3))


def _onetwodigit(rng: random.Random) -> tuple[int, ...]:
    ops = [rng.randrange(10) for _ in range(rng.choice((3, 4)))]
    ops[rng.randrange(len(ops))] = rng.randrange(10, 100)
    return tuple(ops)


def _chain5(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(10) for _ in range(5))


def _pool(source: str, draw, seed: int, draws: int = POOL_DRAWS) -> list[tuple[int, ...]]:
    """A family's distinct prompts in a seeded order (a string seed: the same on every Python)."""
    rng = random.Random(f"{source}-{seed}")
    pool = sorted({draw(rng) for _ in range(draws)})
    rng.shuffle(pool)
    return pool


def hard_candidates(design: HardDesign, seed: int = reason.SPLIT_SEED) -> list[tuple[int, ...]]:
    """A selecting design's candidates for its hard split, in their seeded order (never in the warm-up)."""
    return _selecting_pool(design, seed)[:N_CANDIDATES]


def _selecting_pool(design: HardDesign, seed: int) -> list[tuple[int, ...]]:
    draw = {CHAIN5: _chain5, CHAIN2D: _twodigit}[design.source]
    return _pool(design.source, draw, seed, draws=6 * POOL_DRAWS)


def split_for(design: HardDesign | str, seed: int = reason.SPLIT_SEED, chosen: dict | None = None,
              warmup_only: bool = False) -> reason.Split:
    """The design's held-out, RL and warm-up prompts per data source: ``toy_chain`` and ``toy_bag`` as the default
    toy's, then the hard split (and the warm-up's extra family, disjoint from the hard split's prompts).

    A selecting design's hard split is ``chosen`` (``{"val": [...], "train": [...]}`` from ``build.select_unsolved``);
    without it only ``warmup_only=True`` is allowed (its hard val and train then empty)."""
    design = parse_design(design) if isinstance(design, str) else design
    if design.unsolved_of and chosen is None and not warmup_only:
        raise ValueError(f"design {design.name!r} picks its hard split with the warm-up model: pass chosen=")
    base = reason.split_problems(seed)
    if design.name == "chain6" and design.warmup_share == 0:
        return base
    easy = (reason.DATA_SOURCE_CHAIN, reason.DATA_SOURCE_BAG)
    val = {s: base.val[s] for s in easy}
    train = {s: base.train[s] for s in easy}
    warmup = {s: base.warmup[s] for s in easy}
    if design.unsolved_of:
        chosen = chosen or {"val": [], "train": []}
        val[design.source] = sorted(tuple(o) for o in chosen["val"])
        train[design.source] = sorted(tuple(o) for o in chosen["train"])
        warmup[design.source] = sorted(_selecting_pool(design, seed)[N_CANDIDATES:])
        return reason.Split(val=val, train=train, warmup=warmup)
    if design.source == reason.DATA_SOURCE_LONG:  # chain6's six-digit pool, in its order
        hard = reason._all_problems(seed)[reason.DATA_SOURCE_LONG]
    else:
        hard = _pool(design.source, {CHAIN2D: _twodigit, CHAIN2D3: _twodigit3}[design.source], seed)
    val[design.source] = sorted(hard[:reason.N_VAL])
    train[design.source] = sorted(hard[reason.N_VAL:reason.N_VAL + N_TRAIN_HARD])
    if design.warmup_source == design.source:
        warmup[design.source] = sorted(hard[reason.N_VAL + N_TRAIN_HARD:])
    elif design.warmup_source is not None:
        warmup[design.warmup_source] = sorted(_pool(design.warmup_source, _onetwodigit, seed))
    return reason.Split(val=val, train=train, warmup=warmup)


def reason_warmup_examples(split, seed: int = SEED, recipe: dict | None = None, extra_source: str | None = None,
                           extra_share: float = 0.0) -> list[tuple[str, str, str]]:
    """(prompt, context, target) triples of the reasoning task's warm-up (``recipe``, default ``REASON_SFT``),
    deterministic. ``extra_source`` (a family of ``split.warmup`` beside ``toy_chain`` and ``toy_bag``: a hard-split
    design's) takes ``extra_share`` of the examples, written left to right as ``toy_chain``'s; with none (the
    default) the examples are the default recipe's, draw for draw."""
    recipe = REASON_SFT if recipe is None else recipe
    rng = random.Random(seed)
    out = []
    for _ in range(recipe["examples"]):
        if extra_source is not None and rng.random() < extra_share:
            source = extra_source
        else:
            source = reason.DATA_SOURCE_BAG if rng.random() < recipe["mix_bag"] else reason.DATA_SOURCE_CHAIN
        ops = rng.choice(split.warmup[source])
        prompt = reason.prompt_text(source, ops)
        order = reason.random_order(ops, rng) if source == reason.DATA_SOURCE_BAG else None
        if rng.random() < recipe["fix"]:
            wrong_order = reason.random_order(ops, rng) if order is not None else None
            out.append((prompt, reason.wrong_attempt(source, ops, rng, wrong_order) + reason.CUE,
                        reason.solution(source, ops, order=order)))
        else:
            out.append((prompt, "", reason.solution(source, ops, order=order)))
    return out


def warmup_examples(design: HardDesign, split: reason.Split, recipe: dict | None = None, seed: int | None = None):
    """The design's warm-up examples: the default recipe's with ``warmup_share`` of them from ``warmup_source``."""
    seed = SEED if seed is None else seed
    return reason_warmup_examples(split, seed, recipe, design.warmup_source if design.warmup_share else None,
                                  design.warmup_share)


def train_rows(design: HardDesign, sources: tuple[str, ...] | None = None,
               chosen: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The (data source, operands) of the design's RL pool, in the parquet's order (``reason.make_rows``), restricted
    to ``sources`` as ``+toy.train_sources`` restricts it (``chosen``: a selecting design's hard split)."""
    rows = [(r["data_source"], tuple(r["extra_info"]["operands"]))
            for r in reason.make_rows(split=split_for(design, chosen=chosen))[0]]
    return [r for r in rows if r[0] in sources] if sources else rows


# ---------------------------------------------------------------- cells: a design, a model size, a warm-up recipe


def model_kw(size: str) -> dict:
    """``h<hidden>l<layers>[a<heads>][k<kv heads>][i<intermediate>]`` as Qwen2 settings (``model.MODEL_KW``'s rest)."""
    m = re.fullmatch(r"h(\d+)l(\d+)(?:a(\d+))?(?:k(\d+))?(?:i(\d+))?", size)
    if m is None:
        raise ValueError(f"model size {size!r}: h<hidden>l<layers>[a<heads>][k<kv heads>][i<intermediate>], e.g. h128l4")
    hidden, layers = int(m[1]), int(m[2])
    heads = int(m[3]) if m[3] else max(1, hidden // 32)
    kv = int(m[4]) if m[4] else max(1, heads // 2)
    if hidden % heads or heads % kv:
        raise ValueError(f"model size {size!r}: hidden {hidden} must divide by {heads} heads, heads by {kv} KV heads")
    return {**MODEL_KW, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": int(m[5]) if m[5] else 2 * hidden}


@dataclass(frozen=True)
class Cell:
    spec: str
    design: HardDesign
    size: str
    model_kw: dict = field(hash=False)
    recipe: dict = field(hash=False)  # REASON_SFT with the spec's overrides
    rl_lr: float = TASK_LR["chain6"]  # the search's controls' learning rate (a reasoning toy's: its TASK_LR)

    @property
    def warmup_key(self) -> str:
        """Cells with the same key share one warm-up (they differ in their controls only)."""
        return json.dumps([self.design.label, self.size, self.recipe], sort_keys=True)

    @property
    def name(self) -> str:
        """A file name: ``twodigit@0.02-h128l4`` (+ ``-steps=1500`` ...)."""
        return re.sub(r"[^A-Za-z0-9@.=_-]", "_", self.spec.replace("/", "-").replace(":", "-").replace(",", "-"))

    def n_params(self) -> int:
        h, n_layers, i = self.model_kw["hidden_size"], self.model_kw["num_hidden_layers"], self.model_kw["intermediate_size"]
        kv = self.model_kw["num_key_value_heads"] * h // self.model_kw["num_attention_heads"]
        vocab = tokenizer.VOCAB_SIZE  # tied embeddings
        layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
        return vocab * h + n_layers * layer + h


def parse_cell(spec: str, warmup_steps: int | None = None) -> Cell:
    """``DESIGN[@SHARE]/SIZE[:key=value,...]`` (keys of ``REASON_SFT``: steps, lr, batch, examples, ...; and
    ``rl_lr``, the search's controls' learning rate, default chain6's; ``unsolved_of``, a selecting design's samples
    per candidate)."""
    body, _, over = spec.partition(":")
    design, sep, size = body.partition("/")
    if not sep:
        raise ValueError(f"cell {spec!r}: DESIGN[@SHARE]/SIZE[:key=value,...], e.g. twodigit@0.02/h128l4:steps=1500")
    recipe, control, hard = dict(REASON_SFT), {"rl_lr": TASK_LR["chain6"]}, parse_design(design)
    keys = {**RECIPE_KEYS, **CONTROL_KEYS, **DESIGN_KEYS}
    for item in filter(None, over.split(",")):
        key, eq, value = item.partition("=")
        if key not in keys or not eq:
            raise ValueError(f"cell {spec!r}: {item!r} is not key=value with a key among {list(keys)}")
        if key == "unsolved_of":
            hard = hard.with_unsolved_of(int(value))
        else:
            (control if key in CONTROL_KEYS else recipe)[key] = keys[key](value)
    if warmup_steps is not None:
        recipe["steps"] = warmup_steps
    return Cell(spec, hard, size, model_kw(size), recipe, control["rl_lr"])


def reason_cell(task: str) -> Cell:
    """The design, model size and warm-up recipe of a reasoning toy (``REASON_TASKS``), as a cell, with the RL
    learning rate its config trains with (``TASK_LR``)."""
    return replace(parse_cell(REASON_TASKS[task]), rl_lr=TASK_LR[task])
