"""``python -m verl_ext.report RUN --samples``: a page of what GEC wrote, from verl's rollout dump.

A run trained with ``trainer.rollout_data_dir=DIR`` and GEC on has one ``DIR/<step>.jsonl`` per step, one line per
training response, carrying GEC's columns (``verl_ext.trainer.gec_dump``).  The page (``OUT/samples.html``, one
self-contained HTML file) shows, per branch and per data source, a few responses from chosen steps: the prompt, the
policy's first response, the final (trained) response with each piece marked (cue, continuation, injected answer,
reference solution, added EOS) apart from the policy's own tokens, the scores before and after, and the group's
before/after reward vectors (a group all wrong before whose rewards differ after is flagged as rescued).  Long
texts are cut in the middle with a visible marker, the whole text one click away.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from verl_ext.rollout.gec import BRANCHES, EDIT_BRANCHES
from verl_ext.trainer.gec_dump import (
    DUMP_BRANCH,
    DUMP_CORRECT_BEFORE,
    DUMP_DATA_SOURCE,
    DUMP_FIRST_RESPONSE,
    DUMP_GROUP,
    DUMP_SCORE_BEFORE,
    DUMP_SEGMENTS,
)

DUMP_FILE = re.compile(r"^(\d+)\.jsonl$")  # verl's _write_generations: <dump dir>/<global step>.jsonl
PAGE = "samples.html"
# edits first, then the rows GEC left alone
BRANCH_ORDER = tuple(EDIT_BRANCHES) + tuple(b for b in BRANCHES if b not in EDIT_BRANCHES)


# ---- reading -------------------------------------------------------------------------------------------------------
def _gec_lines(path: Path) -> list[dict]:
    """The dumped lines of one step that carry GEC's columns ([] for any other JSONL)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a partial last line
                if isinstance(row, dict) and row.get(DUMP_BRANCH) is not None and "output" in row:
                    rows.append(row)
    except (OSError, UnicodeDecodeError):
        return []
    return rows


def load_dump(paths: list[Path]) -> dict[int, list[dict]]:
    """``{step: rows}`` of every GEC rollout dump (``<step>.jsonl``) under the given files or folders."""
    files = []
    for path in paths:
        if path.is_file():
            files.append(path)
            continue
        for root, dirs, names in os.walk(path):
            dirs.sort()
            files.extend(Path(root) / n for n in sorted(names) if DUMP_FILE.match(n))
    steps: dict[int, list[dict]] = {}
    for path in files:
        named = DUMP_FILE.match(path.name)
        for row in _gec_lines(path):
            step = row.get("step")
            if not isinstance(step, (int, float)) or isinstance(step, bool):
                if named is None:
                    continue  # no step to file it under
                step = named.group(1)
            steps.setdefault(int(step), []).append(row)
    return steps


def choose_steps(available: list[int], requested: list[int] | None = None, count: int = 3) -> list[int]:
    """The requested steps (each must be dumped), else ``count`` spread from first to last."""
    available = sorted(available)
    if requested:
        missing = sorted(set(requested) - set(available))
        if missing:
            raise ValueError(f"--steps {missing} not in the dump (dumped steps: {available})")
        return sorted(set(requested))
    if len(available) <= count:
        return available
    picks = {available[round(i * (len(available) - 1) / (count - 1))] for i in range(count)} if count > 1 else {
        available[-1]}
    return sorted(picks)


# ---- groups --------------------------------------------------------------------------------------------------------
@dataclass
class Group:
    before: list[float | None]
    after: list[float]
    all_wrong_before: bool
    rescued: bool  # all wrong before, rewards no longer all equal after: GEC gave the group a signal


def groups_of(rows: list[dict]) -> dict[str, Group]:
    """The step's groups (by ``gec_group``), members in dump order."""
    members: dict[str, list[dict]] = {}
    for row in rows:
        members.setdefault(str(row.get(DUMP_GROUP)), []).append(row)
    out = {}
    for uid, rs in members.items():
        before = [r.get(DUMP_SCORE_BEFORE) for r in rs]
        after = [float(r.get("score", float("nan"))) for r in rs]
        all_wrong = all(r.get(DUMP_CORRECT_BEFORE) is False for r in rs)
        out[uid] = Group(before, after, all_wrong, all_wrong and len(set(after)) > 1)
    return out


def pick_examples(steps: dict[int, list[dict]], chosen: list[int], per_cell: int) -> dict[tuple[str, str], list]:
    """Up to ``per_cell`` ``(step, row, group, place in group)`` per (branch, data source), taken in turn from the chosen steps;
    within a step, responses of rescued groups first, then responses whose score changed, then dump order."""
    candidates: dict[tuple[str, str], dict[int, list]] = {}
    for step in chosen:
        rows = steps[step]
        groups = groups_of(rows)
        member, seen = [], {}
        for row in rows:  # each row's place in its group (the group vectors' order)
            uid = str(row.get(DUMP_GROUP))
            member.append(seen.get(uid, 0))
            seen[uid] = member[-1] + 1
        ranked = sorted(range(len(rows)), key=lambda i: (
            not groups[str(rows[i].get(DUMP_GROUP))].rescued,
            rows[i].get(DUMP_SCORE_BEFORE) == rows[i].get("score"),
            i))
        for i in ranked:
            row = rows[i]
            cell = (str(row[DUMP_BRANCH]), str(row.get(DUMP_DATA_SOURCE)))
            candidates.setdefault(cell, {}).setdefault(step, []).append(
                (step, row, groups[str(row.get(DUMP_GROUP))], member[i]))
    picked = {}
    for cell, by_step in candidates.items():
        queues = [list(by_step[s]) for s in chosen if s in by_step]
        out = []
        while len(out) < per_cell and any(queues):
            for q in queues:
                if q and len(out) < per_cell:
                    out.append(q.pop(0))
        picked[cell] = out
    return picked


# ---- rendering -----------------------------------------------------------------------------------------------------
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { margin-top: 1.6em; border-bottom: 2px solid #ccc; } h3 { color: #555; }
table.counts { border-collapse: collapse; font-size: .9em; } table.counts td, table.counts th {
  border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: .6em .9em; margin: .8em 0; background: #fcfcfc; }
.meta { font-size: .9em; color: #333; margin-bottom: .3em; }
.vec { font-family: ui-monospace, monospace; font-size: .85em; color: #444; }
.vec b { color: #000; text-decoration: underline; }
.label { font-size: .8em; font-weight: 600; color: #666; margin-top: .5em; text-transform: uppercase; }
pre { white-space: pre-wrap; word-break: break-word; background: #fff; border: 1px solid #e4e4e4;
  padding: .4em .6em; margin: .2em 0; font-size: .85em; }
.seg-cue { background: #ffd8a8; } .seg-answer { background: #b2f2bb; } .seg-solution { background: #a5d8ff; }
.seg-continuation { background: #eebefa; } .seg-injected { background: #ffc9c9; }
.seg-eos { background: #dee2e6; color: #555; font-size: .8em; padding: 0 2px; border-radius: 3px; }
.tag { font-size: .7em; font-weight: 700; color: #fff; background: #555; border-radius: 3px; padding: 0 3px;
  margin-right: 2px; vertical-align: 1px; }
.cut { color: #b00; font-weight: 600; background: #fff3f3; border: 1px dashed #b00; padding: 0 4px; }
.rescued { color: #fff; background: #2b8a3e; border-radius: 3px; padding: 0 4px; font-size: .85em; }
.score-up { color: #2b8a3e; font-weight: 700; } .score-same { color: #555; }
.empty { color: #888; font-style: italic; }
details > summary { cursor: pointer; font-size: .85em; color: #1c5d99; }
"""

SEGMENT_LABEL = {"cue": "cue", "continuation": "continuation (policy)", "answer": "injected answer",
                 "solution": "reference solution", "eos": "EOS", "injected": "injected"}


def _esc(text) -> str:
    return html.escape("" if text is None else str(text))


def cut_text(text: str, max_chars: int) -> str:
    """HTML of ``text``, its middle replaced by a visible marker when longer than ``max_chars``."""
    if len(text) <= max_chars:
        return _esc(text)
    head, tail = (2 * max_chars) // 3, max_chars // 3
    cut = len(text) - head - tail
    return (_esc(text[:head]) + f'<span class="cut">⋯ {cut:,} characters cut (full text below) ⋯</span>'
            + _esc(text[-tail:]))


def segments_html(segments: list[dict], max_chars: int | None) -> str:
    """The final response, each non-policy piece marked and tagged; policy pieces cut at ``max_chars`` (None: whole).
    The edit itself is never cut."""
    parts = []
    for seg in segments:
        kind, text = seg.get("kind", "policy"), seg.get("text", "")
        if kind == "policy":
            parts.append(cut_text(text, max_chars) if max_chars else _esc(text))
            continue
        title = f'{SEGMENT_LABEL.get(kind, kind)} · {seg.get("tokens", "?")} tokens'
        body = "⟨eos⟩" if kind == "eos" and not text else _esc(text)
        tag = "" if kind == "eos" else f'<span class="tag">{_esc(SEGMENT_LABEL.get(kind, kind))}</span>'
        parts.append(f'{tag}<span class="seg seg-{_esc(kind)}" title="{_esc(title)}">{body}</span>')
    return "".join(parts)


def _fmt(x) -> str:
    if x is None:
        return "–"
    x = float(x)
    return "nan" if math.isnan(x) else f"{x:g}"


def _vector(values, me: int) -> str:
    return "[" + " ".join(f"<b>{_fmt(v)}</b>" if i == me else _fmt(v) for i, v in enumerate(values)) + "]"


EMPTY = '<span class="empty">(empty: the policy ended its response at once)</span>'


def card_html(step: int, row: dict, group: Group, member: int, max_chars: int) -> str:
    before, after = row.get(DUMP_SCORE_BEFORE), row.get("score")
    changed = before is not None and after is not None and float(after) != float(before)
    score_cls = "score-up" if changed else "score-same"
    first = row.get(DUMP_FIRST_RESPONSE) or ""
    segments = row.get(DUMP_SEGMENTS) or [{"kind": "policy", "text": row.get("output", "")}]
    final_len = sum(len(s.get("text", "")) for s in segments)
    prompt = row.get("input", "")
    rescued = ' <span class="rescued">group rescued</span>' if group.rescued else ""
    out = [
        '<div class="card">',
        (f'<div class="meta">step {step} · group <code>{_esc(str(row.get(DUMP_GROUP))[:8])}</code> · '
         f'ground truth <code>{_esc(row.get("gts"))}</code> · score <span class="{score_cls}">{_fmt(before)} → '
         f'{_fmt(after)}</span>{rescued}</div>'),
        (f'<div class="vec">group before {_vector(group.before, member)}<br>group after&nbsp; '
         f'{_vector(group.after, member)}</div>'),
        (f'<details{" open" if len(prompt) <= max_chars // 3 else ""}><summary>prompt ({len(prompt):,} characters)'
         f'</summary><pre>{cut_text(prompt, max_chars)}</pre></details>'),
        '<div class="label">first response (the policy\'s)</div>',
        f"<pre>{cut_text(first, max_chars) if first else EMPTY}</pre>",
    ]
    if len(first) > max_chars:
        out.append(f"<details><summary>full first response</summary><pre>{_esc(first)}</pre></details>")
    out += ['<div class="label">final response (what is trained)</div>',
            f"<pre>{segments_html(segments, max_chars)}</pre>"]
    if final_len > max_chars:
        out.append(f"<details><summary>full final response</summary><pre>{segments_html(segments, None)}</pre>"
                   "</details>")
    out.append("</div>")
    return "\n".join(out)


def counts_html(steps: dict[int, list[dict]]) -> str:
    """Responses per branch and data source over all dumped steps."""
    counts: dict[tuple[str, str], int] = {}
    for rows in steps.values():
        for row in rows:
            cell = (str(row[DUMP_BRANCH]), str(row.get(DUMP_DATA_SOURCE)))
            counts[cell] = counts.get(cell, 0) + 1
    sources = sorted({s for _, s in counts})
    branches = [b for b in BRANCH_ORDER if any(c[0] == b for c in counts)]
    branches += sorted({b for b, _ in counts} - set(branches))
    head = "".join(f"<th>{_esc(s)}</th>" for s in sources)
    body = "".join(
        f"<tr><th>{_esc(b)}</th>" + "".join(f"<td>{counts.get((b, s), 0)}</td>" for s in sources) + "</tr>"
        for b in branches)
    return f'<table class="counts"><tr><th>branch</th>{head}</tr>{body}</table>'


LEGEND = ('<p>Final response: the policy\'s own tokens unmarked; '
          '<span class="tag">cue</span><span class="seg-cue">injected reflection cue</span> '
          '<span class="tag">continuation (policy)</span><span class="seg-continuation">the policy\'s tokens after '
          'the cue</span> <span class="tag">injected answer</span><span class="seg-answer">answer template</span> '
          '<span class="tag">reference solution</span><span class="seg-solution">replacement</span> '
          '<span class="seg-eos">⟨eos⟩</span> added EOS. '
          'Group vectors: every response of the group in dump order, this one in <b>bold</b>; before = the first '
          'response\'s score, after = the trained response\'s. <span class="cut">⋯ cut ⋯</span> marks a shortened '
          'text.</p>')


def render_page(steps: dict[int, list[dict]], chosen: list[int], per_cell: int, max_chars: int, title: str) -> str:
    picked = pick_examples(steps, chosen, per_cell)
    out = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">', f"<title>{_esc(title)}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>What GEC wrote: {_esc(title)}</h1>",
           (f"<p>Dumped steps: {', '.join(map(str, sorted(steps)))}; examples from steps "
            f"{', '.join(map(str, chosen))} (up to {per_cell} per branch and data source).</p>"),
           "<h2>Responses per branch and data source (all dumped steps)</h2>", counts_html(steps), LEGEND]
    branches = [b for b in BRANCH_ORDER if any(c[0] == b for c in picked)]
    branches += sorted({b for b, _ in picked} - set(branches))
    out.append("<p>Branches: " + " · ".join(f'<a href="#{_esc(b)}">{_esc(b)}</a>' for b in branches) + "</p>")
    for branch in branches:
        out.append(f'<h2 id="{_esc(branch)}">branch: {_esc(branch)}</h2>')
        for (b, source), examples in sorted(picked.items()):
            if b != branch:
                continue
            out.append(f"<h3>data source {_esc(source)}</h3>")
            for step, row, group, member in examples:
                out.append(card_html(step, row, group, member, max_chars))
    out.append("</body></html>")
    return "\n".join(out)


def write_samples_page(paths: list[Path], out_dir: Path, requested_steps: list[int] | None = None,
                       per_cell: int = 3, max_chars: int = 1200, title: str = "") -> Path:
    """Write ``out_dir/samples.html`` from the GEC rollout dumps under ``paths``; ValueError when there are none."""
    steps = load_dump(paths)
    if not steps:
        raise ValueError("no GEC rollout dump (<step>.jsonl lines with gec_branch) under "
                         + ", ".join(map(str, paths)) + "; train with algorithm.gec.enable=true and "
                         "trainer.rollout_data_dir=<a folder in the run>")
    chosen = choose_steps(list(steps), requested_steps)
    page = render_page(steps, chosen, per_cell, max_chars, title or ", ".join(map(str, paths)))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PAGE
    path.write_text(page, encoding="utf-8")
    return path
