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
held-out prompts of that family that the warmed-up model solves in none of k samples (``search.select_unsolved``);
hard by whatever the model gets wrong, at a length and format the warm-up covers:

* ``chain5_unsolved``   -- five digits left to right (``toy_chain5``), a fifth of the warm-up: learnt well (94% of
  its candidates solved at 329k parameters), so its unsolved ones are the family's rare failures.
* ``twodigit_unsolved`` -- ``toy_chain2d``'s prompts, 30% of the warm-up.

``split_for(design)`` is ``reason.split_problems()`` itself for ``chain6``, so that design is the first reasoning toy
(``+toy=chain6``), draw for draw.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import reason

CHAIN2D = "toy_chain2d"
CHAIN2D3 = "toy_chain2d3"
CHAIN2D1 = "toy_chain2d1"  # warm-up only (twodigit3)
CHAIN5 = "toy_chain5"
N_CANDIDATES = 12000  # held-out prompts a selecting design picks its hard split from (the rest go to the warm-up)
N_TRAIN_HARD = reason.N_TRAIN[reason.DATA_SOURCE_LONG]  # 600: the RL pool's hard share stays 20%
POOL_DRAWS = 6000  # candidate prompts drawn per generated family (deduplicated)


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

    A selecting design's hard split is ``chosen`` (``{"val": [...], "train": [...]}`` from ``search.select_unsolved``);
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


def warmup_examples(design: HardDesign, split: reason.Split, recipe: dict | None = None, seed: int | None = None):
    """The design's warm-up examples: the default recipe's with ``warmup_share`` of them from ``warmup_source``."""
    from . import build

    seed = build.SEED if seed is None else seed
    return build.reason_warmup_examples(split, seed, recipe, design.warmup_source if design.warmup_share else None,
                                        design.warmup_share)


def train_rows(design: HardDesign, sources: tuple[str, ...] | None = None,
               chosen: dict | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The (data source, operands) of the design's RL pool, in the parquet's order (``reason.make_rows``), restricted
    to ``sources`` as ``+toy.train_sources`` restricts it (``chosen``: a selecting design's hard split)."""
    rows = [(r["data_source"], tuple(r["extra_info"]["operands"]))
            for r in reason.make_rows(split=split_for(design, chosen=chosen))[0]]
    return [r for r in rows if r[0] in sources] if sources else rows
