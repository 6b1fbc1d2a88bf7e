"""``python -m verl_ext.report RUN [RUN ...] [-o OUT] [--last N] [--by-method] [--smoothing W] [--samples]``: figures
and a summary table of runs; with ``--samples``, also a page of what GEC wrote (``verl_ext.report_samples``).

A RUN is a run folder (``outputs/<experiment>/<time>``), a multirun folder (every job in it becomes a run), or one
JSONL file.  The metrics are what verl's ``file`` logger wrote (one ``{"step": N, "data": {metric: value}}`` per
line; verl_ext's configs put it at ``<run folder>/metrics.jsonl``, and a run resumed into the same folder continues in
``metrics.1.jsonl``, ...).  Every figure draws the runs side by side on shared axes (one colour per run) and is
written as a PNG under OUT; a metric no run logged is skipped, and so is a figure left without panels.  The summary
table (markdown, printed and written to ``OUT/summary.md``) holds the mean of the last N logged values of training
metrics and the last value of validation metrics.  ``--by-method`` adds a second table with one row per method:
runs whose labels differ only in a ``_seed<N>`` suffix (``examples/toy/compare.sh``'s ``toy_<method>_seed<N>``) are
one method, shown as the mean over its seeds with the seeds' range, and the figures then draw one line per method
(the mean over its seeds, the seeds' range shaded) instead of one per run.

The figures read at a glance: a data source's sampled and greedy validation accuracy share one panel; accuracies are
drawn on [0, 1] and every other y-axis reaches at least 0.05 beyond its data, so one held-out sample does not fill a
panel; a metric logged every step is drawn faint under its moving average (``--smoothing``, TensorBoard's debiased
EMA), and left out of its panel and legend (named beside it) when it is zero at every step; no two series of a panel
share a colour.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from verl_ext.metrics_file import parse_record, read_steps
from verl_ext.names import GREEDY_SUFFIX

METRICS_FILE = re.compile(r"^metrics(?:\.(\d+))?\.jsonl$")  # metrics.jsonl, then metrics.1.jsonl, ... on resume


# ---- reading -----------------------------------------------------------------------------------------------------
@dataclass
class RunMetrics:
    """One run: ``steps[step][metric] = value`` (NaN where the logger wrote null/NaN)."""

    label: str
    source: Path
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    bad_lines: int = 0  # unparseable lines (a run killed mid-write leaves a partial last line)

    def keys(self) -> set[str]:
        return {k for values in self.steps.values() for k in values}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in step order, finite values only."""
        points = [(s, v[key]) for s, v in sorted(self.steps.items()) if key in v and math.isfinite(v[key])]
        return [s for s, _ in points], [v for _, v in points]


@dataclass
class MethodMetrics:
    """The runs of one method (``method_of``: labels that differ only in ``_seed<N>``), drawn as one line: the mean
    over its seeds at each step, and the seeds' range."""

    label: str
    runs: list[RunMetrics]

    def keys(self) -> set[str]:
        return set().union(*(run.keys() for run in self.runs))

    def _points(self, key: str) -> dict[int, list[float]]:
        points: dict[int, list[float]] = {}
        for run in self.runs:
            for step, value in zip(*run.series(key)):
                points.setdefault(step, []).append(value)
        return dict(sorted(points.items()))

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, mean over the seeds that logged the step)."""
        points = self._points(key)
        return list(points), [sum(v) / len(v) for v in points.values()]

    def spread(self, key: str) -> tuple[list[int], list[float], list[float]]:
        """(steps, min, max) over the seeds."""
        points = self._points(key)
        return list(points), [min(v) for v in points.values()], [max(v) for v in points.values()]


def group_by_method(runs: list[RunMetrics]) -> list[MethodMetrics]:
    """One ``MethodMetrics`` per method, in the order of the methods' first runs; its label says how many seeds."""
    methods: dict[str, list[RunMetrics]] = {}
    for run in runs:
        methods.setdefault(method_of(run.label), []).append(run)
    return [MethodMetrics(f"{name} ({len(group)} seed{'s' if len(group) > 1 else ''})", group)
            for name, group in methods.items()]


def is_metrics_file(path: Path) -> bool:
    """A verl file-logger JSONL: its first non-empty line is a {"step", "data"} record (other JSONL is skipped)."""
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    return parse_record(line) is not None
    except (OSError, UnicodeDecodeError):
        return False
    return False


def read_run(files: list[Path], label: str, source: Path) -> RunMetrics:
    """Merge the segments of one run in order; a later segment's value for a step replaces an earlier one
    (a resumed run logs again the steps after its checkpoint)."""
    run = RunMetrics(label=label, source=source)
    for path in files:
        steps, bad = read_steps(path)
        run.bad_lines += bad
        for step, values in steps.items():
            run.steps.setdefault(step, {}).update(values)
    return run


def _segment_order(path: Path) -> int:
    m = METRICS_FILE.match(path.name)
    return int(m.group(1) or 0) if m else 0


def find_runs(path: Path) -> list[tuple[Path, list[Path]]]:
    """(run source, its JSONL files in order) for a file or every run under a folder.

    In a folder, ``metrics*.jsonl`` files of one directory are one run (segments); any other file-logger JSONL
    (verl's default ``<project>/<experiment>.jsonl``) is a run of its own.
    """
    if path.is_file():
        return [(path, [path])] if is_metrics_file(path) else []
    runs = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        root_path = Path(root)
        candidates = [root_path / n for n in sorted(names) if n.endswith(".jsonl")]
        candidates = [p for p in candidates if is_metrics_file(p)]
        segments = sorted((p for p in candidates if METRICS_FILE.match(p.name)), key=_segment_order)
        if segments:
            runs.append((root_path, segments))
        runs.extend((p, [p]) for p in candidates if not METRICS_FILE.match(p.name))
    return runs


def run_labels(sources: list[Path]) -> list[str]:
    """The shortest path suffixes that tell the runs apart (two components at least for a single run)."""
    if not sources:
        return []
    parts = [(s.with_suffix("") if s.is_file() else s).resolve().parts for s in sources]
    for n in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-n:]) for p in parts]
        if len(set(labels)) == len(labels) and (len(labels) > 1 or n >= min(2, len(parts[0]))):
            return labels
    return ["/".join(p) for p in parts]


def load_runs(paths: list[Path]) -> list[RunMetrics]:
    found, seen = [], set()
    for source, files in (item for p in paths for item in find_runs(p)):
        if source.resolve() not in seen:  # a run named twice (or inside a folder also given) is drawn once
            seen.add(source.resolve())
            found.append((source, files))
    labels = run_labels([source for source, _ in found])
    return [read_run(files, label, source) for (source, files), label in zip(found, labels)]


# ---- what to draw --------------------------------------------------------------------------------------------------
UNIT = (0.0, 1.0)  # accuracies and shares
NON_NEGATIVE = (0.0, math.inf)  # counts, variances, entropies
MIN_PAD = 0.05  # the y-axis reaches at least this far beyond the data: a change of one held-out sample stays small
REL_PAD = 0.05  # and 5% of the data's range
EDGE_MARGIN = 0.02  # beyond a bound the data touches (a share of the axis), so that markers on it show whole
DEFAULT_SMOOTHING = 0.8  # the EMA weight of --smoothing
MIN_SMOOTHED_POINTS = 5  # a series with fewer points is drawn raw only


def ema_smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar smoothing: an exponential moving average with weight ``weight`` on the past, debiased
    (divided by ``1 - weight**n`` after n points) so that it starts at the first value rather than near zero.
    ``weight`` 0 returns the values unchanged."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    smoothed, last = [], 0.0
    for n, value in enumerate(values, start=1):
        last = last * weight + (1.0 - weight) * value
        smoothed.append(last / (1.0 - weight**n))
    return smoothed


def y_limits(values: list[float], bounds: tuple[float, float] | None = None, whole_range: bool = False,
             min_pad: float = MIN_PAD) -> tuple[float, float] | None:
    """A panel's y-range: the data with ``max(min_pad, REL_PAD * its range)`` either side, kept inside ``bounds``
    (and still ``2 * min_pad`` tall when a bound cuts it), so that a change of one sample never fills the panel;
    ``whole_range``: all of ``bounds`` (and any data beyond them).  A bound the range reaches gets a thin margin
    past it.  None when there is nothing to fit."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite and not (whole_range and bounds):
        return None
    low_b, high_b = bounds or (-math.inf, math.inf)
    if whole_range and bounds:
        low, high = min([low_b, *finite]), max([high_b, *finite])
    else:
        pad = max(min_pad, REL_PAD * (max(finite) - min(finite)))
        low, high = max(min(finite) - pad, low_b), min(max(finite) + pad, high_b)
        if high - low < 2 * min_pad:  # cut by a bound: the height goes to the other side
            if low <= low_b:
                high = min(low + 2 * min_pad, high_b)
            else:
                low = max(high - 2 * min_pad, low_b)
    margin = EDGE_MARGIN * (high - low)
    return low - (margin if low <= low_b else 0.0), high + (margin if high >= high_b else 0.0)


def distinct_colours(n: int) -> list[str]:
    """``n`` different colours (hex): matplotlib's tab10 up to 10, tab20 (its ten dark shades, then the ten light
    ones) up to 20, evenly spaced along ``turbo`` beyond."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    if n <= 10:
        colours = colormaps["tab10"].colors[:n]
    elif n <= 20:
        tab20 = colormaps["tab20"].colors
        colours = (tab20[0::2] + tab20[1::2])[:n]
    else:
        colours = [colormaps["turbo"](i / (n - 1)) for i in range(n)]
    return [to_hex(c) for c in colours]


def zero_throughout(values: list[float]) -> bool:
    """A step metric that is 0 at every logged step (a GEC branch that never fired): left out of its panel and
    legend, and named beside it."""
    return bool(values) and all(v == 0 for v in values)


@dataclass(frozen=True)
class Panel:
    """One axes: every metric whose key matches a pattern, for every run.  A pattern's named group ``panel``
    (e.g. the data source) splits the matches into one panel each; group ``line`` names the line."""

    title: str
    patterns: tuple[str, ...]
    ylabel: str = ""
    std_suffix: tuple[str, str] | None = None  # (mean, std) key endings: draw mean ± std as a band
    display: dict = field(default_factory=dict)  # line name -> legend text
    bounds: tuple[float, float] | None = None  # where the values can lie (UNIT, NON_NEGATIVE): the y-axis stays in
    whole_range: bool = False  # the y-axis spans all of ``bounds`` (accuracies)
    overlay: bool = False  # a run's several lines share one axes with the other runs' (run: colour, line: dashes)
    # logged every step: a smoothed line (--smoothing) over the faint raw one, and a series zero at every step is
    # left out (validation points are drawn as measured: an accuracy of 0 is a result)
    step_metric: bool = True


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    panels: tuple[Panel, ...]


# a data source and its greedy copy (``<source>@greedy``) in one panel; line "" is the sampled figure
VAL_LINES = {"": "sampled", GREEDY_SUFFIX: "greedy"}
_VAL_SOURCE = r"val-core/(?P<panel>.+?)(?P<line>" + re.escape(GREEDY_SUFFIX) + r")?"

FIGURES = (
    Figure("training", "Training reward and accuracy", (
        # the score of the trained responses: with a 0/1 reward and GEC off, the training accuracy
        Panel("reward (mean score of the step's responses)", (r"critic/score/mean",), "reward"),
        # with GEC on the score is post-correction: the policy's own accuracy is gec/acc_before
        Panel("accuracy (policy's own responses, before GEC)", (r"gec/acc_before",), "accuracy",
              bounds=UNIT, whole_range=True),
    )),
    Figure("validation", "Validation accuracy per data source, sampled and greedy", (
        Panel("val {panel}", (_VAL_SOURCE + r"/acc/mean@\d+",), "accuracy", display=VAL_LINES, bounds=UNIT,
              whole_range=True, overlay=True, step_metric=False),
        Panel("val {panel} (reward)", (_VAL_SOURCE + r"/reward/mean@\d+",), "reward", display=VAL_LINES,
              overlay=True, step_metric=False),
    )),
    Figure("step_diagnostics", "Response entropy, advantage variance, collapsed groups", (
        Panel("response entropy (mean ± std over responses)", (r"verl_ext/response_entropy_(?P<line>mean)",),
              "nats/token", std_suffix=("_mean", "_std"), bounds=NON_NEGATIVE),
        Panel("advantage variance (per response)", (r"verl_ext/adv_var",), "var", bounds=NON_NEGATIVE),
        Panel("collapsed-group fraction (zero reward variance)", (r"verl_ext/collapsed_group_frac",), "fraction",
              bounds=UNIT),
        Panel("all-wrong groups before correction {panel}", (r"verl_ext/(?P<panel>.+)/groups_all_wrong_frac",),
              "fraction of groups", bounds=UNIT),
    )),
    Figure("gepo", "GEPO: entropy thresholds, batch μ, attenuated fractions", (
        Panel("group entropy {panel}", (r"gepo/(?:(?P<panel>.+)/)?(?P<line>H_low|H_high|H_mean)",), "H",
              display={"H_mean": "batch μ", "H_low": "H_low (EMA)", "H_high": "H_high (EMA)"}),
        Panel("attenuated {panel}", (r"gepo/(?:(?P<panel>.+)/)?(?P<line>frac_pos_attenuated|frac_neg_attenuated)",),
              "share of positive / negative advantages", bounds=UNIT,
              display={"frac_pos_attenuated": "positives × α_low", "frac_neg_attenuated": "negatives × α_high"}),
    )),
    Figure("gec", "Guided Error Correction", (
        Panel("branches per step", (r"gec/count/(?P<line>.+)",), "responses", bounds=NON_NEGATIVE),
        Panel("accuracy before / after correction", (r"gec/acc_(?P<line>before|after)",), "accuracy", bounds=UNIT,
              whole_range=True),
        Panel("groups", (r"gec/(?P<line>groups_collapsed_before|groups_collapsed_after|groups_rescued)",), "groups",
              bounds=NON_NEGATIVE),
    )),
)


@dataclass
class Line:
    run: RunMetrics
    key: str
    name: str  # within the panel ("" when the panel has one metric, or for a data source's sampled figure)


def resolve_panels(panel: Panel, runs: list[RunMetrics]) -> list[tuple[str, list[Line]]]:
    """The concrete panels (title, lines) one Panel spec yields for these runs; empty when nothing matches."""
    patterns = [re.compile(p + "$") for p in panel.patterns]
    by_panel: dict[str, list[Line]] = {}
    for run in runs:
        for key in sorted(run.keys()):
            if panel.std_suffix and key.endswith(panel.std_suffix[1]):
                continue  # drawn as the band of its mean
            for pattern in patterns:
                m = pattern.match(key)
                if m and run.series(key)[0]:
                    groups = m.groupdict()
                    by_panel.setdefault(groups.get("panel") or "", []).append(Line(run, key, groups.get("line") or ""))
                    break
    resolved = []
    for name in sorted(by_panel):
        title = panel.title.format(panel=name or "(all)") if "{panel}" in panel.title else panel.title
        resolved.append((title, by_panel[name]))
    return resolved


@dataclass
class Axes:
    spec: Panel
    title: str
    lines: list[Line]
    per_run: bool  # one run's several metrics (coloured by metric) rather than several runs (coloured by run)
    line_colours: dict[str, str] | None = None  # line name -> colour, where the lines rather than the runs get them
    ylim: tuple[float, float] | None = None  # shared along a row of one axes per run

    @property
    def drawn(self) -> list[Line]:
        zero = {id(line) for line in self.zero}
        return [line for line in self.lines if id(line) not in zero]

    @property
    def zero(self) -> list[Line]:
        """The step metrics left out for being zero throughout."""
        if not self.spec.step_metric:
            return []
        return [line for line in self.lines if zero_throughout(line.run.series(line.key)[1])]

    def label(self, line: Line) -> str:
        display = self.spec.display.get(line.name, line.name)
        return display if self.per_run else line.run.label + (f" · {display}" if display else "")

    def extent(self) -> list[float]:
        """Every y value the drawn lines and their shaded bands reach."""
        values = []
        for line in self.drawn:
            steps, ys = line.run.series(line.key)
            values += ys
            if isinstance(line.run, MethodMetrics) and len(line.run.runs) > 1:
                _, low, high = line.run.spread(line.key)
                values += low + high
            elif self.spec.std_suffix:
                band = _std_band(line, self.spec.std_suffix, steps, ys)
                values += [v - s for _, v, s in band] + [v + s for _, v, s in band]
        return values


def layout(figure: Figure, runs: list[RunMetrics]) -> list[list[Axes]]:
    """Rows of axes.  A panel of one metric per run overlays the runs; a panel of several metrics per run (GEPO's
    thresholds, GEC's branches) gets one axes per run, side by side in a row with a shared y range, unless its spec
    overlays them (a data source's sampled and greedy accuracy: runs in colours, the two in dashes).  The lines'
    colours (by metric in a row of one run per axes, or in a one-run panel of several metrics; else by run) and the
    y-ranges are fixed here, for the whole row."""
    rows = []
    for spec in figure.panels:
        for title, lines in resolve_panels(spec, runs):
            if spec.overlay or len({line.name for line in lines}) <= 1:
                row = [Axes(spec, title, lines, per_run=False)]
            else:
                row = [Axes(spec, f"{title}: {run.label}", [ln for ln in lines if ln.run is run], per_run=True)
                       for run in runs if any(ln.run is run for ln in lines)]
            names = sorted({line.name for item in row for line in item.drawn})
            if row[0].per_run or (len({id(line.run) for line in lines}) == 1 and len(names) > 1):
                colours = dict(zip(names, distinct_colours(len(names))))
                for item in row:
                    item.line_colours = colours
            ylim = y_limits([v for item in row for v in item.extent()], spec.bounds, spec.whole_range)
            for item in row:
                item.ylim = ylim
            rows.append(row)
    return rows


def draw_figure(figure: Figure, runs: list, out_dir: Path, note: str = "",
                smoothing: float = DEFAULT_SMOOTHING) -> Path | None:
    """Write ``out_dir/<figure.name>.png``; None (nothing written) when no run logged any of its metrics.

    ``runs``: ``RunMetrics`` (one line each) or ``MethodMetrics`` (one line per method, the seeds' range shaded).
    A step metric's values are drawn faint under their EMA (``ema_smooth`` with weight ``smoothing``; 0: the raw
    line only).  Legends sit outside the axes, right of each panel, with the series left out for being zero
    throughout named under them; ``note`` goes under the figure's title."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    rows = layout(figure, runs)
    if not rows:
        return None
    width = max(len(row) for row in rows)
    if width == 1:  # nothing side by side: flow the panels over up to three columns
        flat = [row[0] for row in rows]
        width = min(3, len(flat))
        rows = [flat[i: i + width] for i in range(0, len(flat), width)]
    fig, grid = plt.subplots(len(rows), width, figsize=(7.6 * width, 3.6 * len(rows)), squeeze=False)
    run_colour = dict(zip((run.label for run in runs), distinct_colours(len(runs))))
    styles = ["-", "--", ":", "-."]
    smoothed = False
    for row, axes_row in zip(rows, grid):
        for item, ax in zip(row, axes_row):
            names = sorted({line.name for line in item.lines})
            for line in item.drawn:
                steps, values = line.run.series(line.key)
                colour = item.line_colours[line.name] if item.line_colours else run_colour[line.run.label]
                style = "-" if item.per_run else styles[names.index(line.name) % len(styles)]
                marker = "o" if len(steps) <= 20 else None
                if smoothing > 0 and item.spec.step_metric and len(steps) >= MIN_SMOOTHED_POINTS:
                    ax.plot(steps, values, style, color=colour, marker=marker, markersize=2, linewidth=0.8, alpha=0.3)
                    ax.plot(steps, ema_smooth(values, smoothing), style, color=colour, label=item.label(line))
                    smoothed = True
                else:
                    ax.plot(steps, values, style, color=colour, label=item.label(line), marker=marker, markersize=3)
                if isinstance(line.run, MethodMetrics) and len(line.run.runs) > 1:
                    band_steps, low, high = line.run.spread(line.key)
                    ax.fill_between(band_steps, low, high, color=colour, alpha=0.15, linewidth=0)
                elif item.spec.std_suffix:
                    band = _std_band(line, item.spec.std_suffix, steps, values)
                    if band:
                        ax.fill_between([b[0] for b in band], [b[1] - b[2] for b in band],
                                        [b[1] + b[2] for b in band], color=colour, alpha=0.15, linewidth=0)
            if item.ylim:
                ax.set_ylim(*item.ylim)
            ax.set_title(item.title, fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel(item.spec.ylabel)
            ax.grid(alpha=0.3)
            if item.drawn:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
            if item.zero:
                ax.text(1.01, 0.0, "zero throughout (not drawn):\n" + "\n".join(item.label(ln) for ln in item.zero),
                        transform=ax.transAxes, fontsize=7, va="bottom", ha="left", color="0.35")
        for ax in axes_row[len(row):]:
            ax.set_visible(False)
    if smoothed:
        note += ("\n" if note else "") + (f"faint: each step's value; solid: its EMA (weight {smoothing}, debiased, "
                                          "as TensorBoard smooths; --smoothing 0: off)")
    fig.suptitle(figure.title + (f"\n{note}" if note else ""), fontsize=11)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{figure.name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _std_band(line: Line, suffixes: tuple[str, str], steps, values) -> list[tuple[int, float, float]]:
    """(step, mean, std) at the steps where the run also logged the mean's ``std`` partner key."""
    std_steps, stds = line.run.series(line.key[: -len(suffixes[0])] + suffixes[1])
    std_of = dict(zip(std_steps, stds))
    return [(s, v, std_of[s]) for s, v in zip(steps, values) if s in std_of]


# ---- summary table -------------------------------------------------------------------------------------------------
SUMMARY_COLUMNS = (  # (header, metric pattern); a column no run has is left out; val-* columns: last value
    ("reward", r"critic/score/mean"),
    ("acc (before GEC)", r"gec/acc_before"),
    ("val {panel}", r"val-core/(?P<panel>.+)/acc/mean@\d+"),
    ("H resp", r"verl_ext/response_entropy_mean"),
    ("adv var", r"verl_ext/adv_var"),
    ("collapsed", r"verl_ext/collapsed_group_frac"),
    ("all-wrong {panel}", r"verl_ext/(?P<panel>.+)/groups_all_wrong_frac"),
    ("GEPO pos att.", r"gepo/frac_pos_attenuated"),
    ("GEPO neg att.", r"gepo/frac_neg_attenuated"),
    ("GEC acc after", r"gec/acc_after"),
)


def summary_value(run: RunMetrics, key: str, last: int) -> float | None:
    _, values = run.series(key)
    if not values:
        return None
    if key.startswith("val-"):
        return values[-1]  # logged every test_freq steps: the latest evaluation
    tail = values[-last:]
    return sum(tail) / len(tail)


SEED_SUFFIX = re.compile(r"_seed\d+$")


def method_of(label: str) -> str:
    """A run label without its seed: ``.../toy_grpo_seed2`` -> ``toy_grpo``."""
    return SEED_SUFFIX.sub("", label.rsplit("/", 1)[-1])


def summary_columns(runs: list[RunMetrics]) -> list[tuple[str, dict[str, str]]]:
    """(header, {run label: metric key}) for every summary column some run logged."""
    columns: list[tuple[str, dict[str, str]]] = []
    for header, pattern in SUMMARY_COLUMNS:
        compiled = re.compile(pattern + "$")
        found: dict[str, dict[str, str]] = {}
        for run in runs:
            for key in sorted(run.keys()):
                m = compiled.match(key)
                if m and run.series(key)[0]:
                    name = header.format(panel=m.groupdict().get("panel") or "")
                    found.setdefault(name, {}).setdefault(run.label, key)
        columns.extend(sorted(found.items()))
    return columns


def by_method_table(runs: list[RunMetrics], last: int = 10) -> str:
    """One row per method (runs grouped by :func:`method_of`): mean over seeds, the seeds' min-max in brackets."""
    columns = summary_columns(runs)
    methods: dict[str, list[RunMetrics]] = {}
    for run in runs:
        methods.setdefault(method_of(run.label), []).append(run)
    head = ["method", "seeds"] + [name for name, _ in columns]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, group in methods.items():
        cells = [method, str(len(group))]
        for _, keys in columns:
            values = [summary_value(r, keys[r.label], last) for r in group if r.label in keys]
            values = [v for v in values if v is not None]
            if not values:
                cells.append("—")
            elif len(values) == 1:
                cells.append(f"{values[0]:.3f}")
            else:
                cells.append(f"{sum(values) / len(values):.3f} [{min(values):.3f}–{max(values):.3f}]")
        rows.append("| " + " | ".join(cells) + " |")
    note = (f"Mean over each method's seeds [min–max]. Training columns: mean of the last {last} logged steps; "
            "val columns: the last evaluation.")
    return "\n".join(rows) + "\n\n" + note + "\n"


def summary_table(runs: list[RunMetrics], last: int = 10) -> str:
    columns = summary_columns(runs)
    head = ["run", "steps"] + [name for name, _ in columns]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [run.label, str(max(run.steps)) if run.steps else "0"]
        for _, keys in columns:
            value = summary_value(run, keys[run.label], last) if run.label in keys else None
            cells.append("—" if value is None else f"{value:.4g}")
        rows.append("| " + " | ".join(cells) + " |")
    note = f"Training columns: mean of the last {last} logged steps; val columns: the last evaluation."
    return "\n".join(rows) + "\n\n" + note + "\n"


# ---- command line --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_ext.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folder, multirun folder or JSONL")
    parser.add_argument("-o", "--out", type=Path, default=None,
                        help="output folder (default: RUN/report for a single folder, else ./report)")
    parser.add_argument("--last", type=int, default=10, help="steps averaged in the summary table (default 10)")
    parser.add_argument("--by-method", action="store_true",
                        help="also a table with one row per method (runs named <method>_seed<N>), mean over seeds")
    parser.add_argument("--smoothing", type=float, default=DEFAULT_SMOOTHING,
                        help="weight of the moving average drawn over each step metric, in [0, 1), as TensorBoard's "
                             f"smoothing (default {DEFAULT_SMOOTHING}; 0: each step's value only)")
    parser.add_argument("--samples", action="store_true",
                        help="also OUT/samples.html: examples of GEC's edits from the run's rollout dump "
                             "(trainer.rollout_data_dir inside RUN, or RUN is that folder)")
    parser.add_argument("--steps", type=str, default=None,
                        help="with --samples: the steps to take examples from, e.g. 1,5,10 (default: first, "
                             "middle and last dumped step)")
    parser.add_argument("--examples", type=int, default=3,
                        help="with --samples: examples per branch and data source (default 3)")
    parser.add_argument("--max-chars", type=int, default=1200,
                        help="with --samples: longer texts are cut in the middle, with a marker (default 1200)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be >= 1, got {args.last}")
    if not 0 <= args.smoothing < 1:
        parser.error(f"--smoothing must be in [0, 1) (0: off, e.g. {DEFAULT_SMOOTHING}), got {args.smoothing}")
    if args.examples < 1 or args.max_chars < 50:
        parser.error(f"--examples must be >= 1 and --max-chars >= 50, got {args.examples}, {args.max_chars}")
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()] if args.steps else None
    except ValueError:
        parser.error(f"--steps: comma-separated step numbers, got {args.steps!r}")
    missing = [str(p) for p in args.runs if not p.exists()]
    if missing:
        parser.error(f"not found: {', '.join(missing)}")
    runs = load_runs(args.runs)
    if not runs and not args.samples:
        parser.error("no verl file-logger JSONL (metrics.jsonl) under " + ", ".join(map(str, args.runs))
                     + "; log with trainer.logger including 'file'")
    out = args.out or (args.runs[0] / "report" if len(args.runs) == 1 and args.runs[0].is_dir() else Path("report"))
    if args.samples:
        from verl_ext.report_samples import write_samples_page

        try:
            page = write_samples_page(args.runs, out, steps, per_cell=args.examples, max_chars=args.max_chars)
        except ValueError as e:
            parser.error(str(e))
        print(f"wrote {page}")
        if not runs:
            print("no metrics.jsonl: figures and summary skipped")
            return 0
    for run in runs:
        note = f", {run.bad_lines} unreadable line(s) skipped" if run.bad_lines else ""
        print(f"run {run.label}: {len(run.steps)} logged steps from {run.source}{note}")
    drawn, note = runs, ""
    if args.by_method:  # one line per method: the mean over its seeds, the seeds' range shaded
        drawn = group_by_method(runs)
        note = "one line per method: mean over its seeds, shaded: the seeds' range (min-max)"
    for figure in FIGURES:
        path = draw_figure(figure, drawn, out, note, args.smoothing)
        print(f"wrote {path}" if path else f"skipped {figure.name}.png: no run logged its metrics")
    table = summary_table(runs, args.last)
    if args.by_method:
        table += "\n" + by_method_table(runs, args.last)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table)
    print()
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
