"""The toy package in layers (docs/layout.md): each module imports only from its own layer or the ones below, the
runtime (what ``python -m verl_ext.main`` builds the toy with) never imports the research tools, and no module of the
package, nor of verl_ext, is part of an import circle. Read from the sources (every import, at module level or inside
a function), so an import a run happens not to reach still counts."""

from __future__ import annotations

import ast
from pathlib import Path

import verl_ext

PACKAGE = Path(verl_ext.__file__).parent
TOY = PACKAGE / "toy"

# bottom up; a module may import from its own layer and the ones below
LAYERS = (
    ("task data and rewards", ("reason", "task", "tokenizer", "reward", "reason_reward")),
    ("design and cell specs", ("designs",)),
    ("the model", ("model",)),
    ("the runtime build", ("build", "__init__", "__main__")),
    ("the research tools", ("sft_control", "search")),
)
RESEARCH = dict(LAYERS)["the research tools"]
RESEARCH_FILES = ("search_prompts.json",)  # the research tools' data: the runtime never reads it


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The verl_ext modules (among ``modules``) that ``path`` imports: ``from . import x`` is ``pkg.x`` when that is
    a module, else ``pkg``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names)
    return found & modules


def _graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules under ``root`` it imports. A module's import of a package it belongs to
    (``verl_ext.cpu.platform`` importing ``verl_ext.cpu``) is left out: Python loads that package before the module
    whatever the module imports, so that edge orders nothing."""
    files = {_module_name(f): f for f in sorted(root.rglob("*.py"))}
    modules = {_module_name(f) for f in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(f, modules) if i in files and i != m and not m.startswith(i + ".")}
            for m, f in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _short(module: str) -> str:
    return module.removeprefix("verl_ext.toy.") if module != "verl_ext.toy" else "__init__"


def test_every_toy_module_has_a_layer():
    names = {p.stem for p in TOY.glob("*.py")}
    placed = [m for _, mods in LAYERS for m in mods]
    assert sorted(placed) == sorted(names), "a toy module without a layer (or a layer naming a module that is gone)"


def test_the_runtime_never_imports_the_research_tools():
    graph = _graph(TOY)
    research = {f"verl_ext.toy.{m}" for m in RESEARCH}
    bad = {_short(m): sorted(_short(i) for i in deps & research)
           for m, deps in graph.items() if m not in research and deps & research}
    assert not bad, f"runtime modules import the research tools: {bad}"
    for path in TOY.glob("*.py"):
        if path.stem not in RESEARCH:
            text = path.read_text()
            assert not [f for f in RESEARCH_FILES if f in text], f"{path.name} reads the research tools' data"


def test_each_toy_module_imports_only_its_layer_and_below():
    rank = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
    layer_name = {m: name for name, mods in LAYERS for m in mods}
    upward = []
    for m, deps in _graph(TOY).items():
        for d in deps:
            if rank[_short(d)] > rank[_short(m)]:
                upward.append(f"{_short(m)} ({layer_name[_short(m)]}) imports {_short(d)} ({layer_name[_short(d)]})")
    assert not upward, upward


def test_no_import_circle_in_the_toy_package():
    assert _cycles(_graph(TOY)) == []


def test_no_import_circle_in_verl_ext():
    assert _cycles(_graph(PACKAGE)) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
