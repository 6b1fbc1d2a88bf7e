"""Post-import hooks: run a function right after a named module has been executed in this process.

``verl_ext.plugin`` registers verl_ext with verl lazily through these: an estimator registration runs when verl's
``core_algos`` is imported, the ``gec_agent`` loop when verl's agent-loop package is, and so on, so a process that
imports verl but never those modules pays for none of it.

:func:`when_imported` puts one finder at the front of ``sys.meta_path``. For a watched module name it asks the other
finders for the spec, as the import system would, and wraps the spec's loader so that ``exec_module`` runs the
module and then its hooks; the module itself gets the original loader back (``__loader__``, ``__spec__.loader``),
so it looks exactly as it would without the hook. Every other import passes through untouched. A module that is
already imported has its hooks run at once. An ``around`` hook runs in place of the module's execution and executes
it itself (``verl_ext.cpu.vllm_cpu`` changes a function only while a module body runs).

A hook that raises is loud where it fires: it is logged at ERROR and re-raised as :class:`PluginHookError` naming
what was being registered, the verl module, and the cause, out of the import statement that triggered it (which
then fails, as a broken import would). It is not an ``ImportError``, so ``try: import ... except ImportError``
around an optional import does not swallow it.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

Hook = Callable[[ModuleType], None]
AroundHook = Callable[[Callable[[ModuleType], None], ModuleType], None]

# module name -> [(what the hook does, hook, runs around the module's execution)], in registration order
_HOOKS: dict[str, list[tuple[str, Callable, bool]]] = {}


class PluginHookError(RuntimeError):
    """A verl_ext registration that runs when a verl module is imported failed (the message names the cause)."""


def when_imported(module_name: str, what: str, hook: Hook | AroundHook, *, around: bool = False) -> None:
    """Run ``hook(module)`` right after ``module_name`` is executed in this process, or now if it already is.

    Args:
        module_name: the full dotted name of the module to watch.
        what: what the hook does, for the error message ("register the gec_agent agent loop").
        hook: called with the executed module; must be idempotent (a reload runs it again). Registering the same
            hook again for the same module does nothing.
        around: ``hook(exec_module, module)`` runs in place of the module's execution and calls
            ``exec_module(module)`` itself (to change something only while the module body runs); for a module
            already imported it gets an ``exec_module`` that does nothing.
    """
    hooks = _HOOKS.setdefault(module_name, [])
    entry = (what, hook, around)
    if entry in hooks:
        return
    hooks.append(entry)
    _install_finder()
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hook(module_name, what, hook, around, module, lambda m: None)


def watched() -> dict[str, list[str]]:
    """What is hooked: module name -> what its hooks do."""
    return {name: [what for what, _, _ in hooks] for name, hooks in _HOOKS.items()}


def _run_hook(module_name: str, what: str, hook: Callable, around: bool, module: ModuleType,
              exec_module: Callable[[ModuleType], None]) -> None:
    module_errors: list[BaseException] = []

    def run_module(m: ModuleType) -> None:  # the module's own failure is not the hook's
        try:
            exec_module(m)
        except BaseException as e:
            module_errors.append(e)
            raise

    try:
        if around:
            hook(run_module, module)
        else:
            hook(module)
    except Exception as e:  # any failure of a registration: reported with its cause, re-raised
        if e in module_errors:
            raise
        message = (f"verl_ext could not {what} when {module_name} was imported: {type(e).__name__}: {e} "
                   "(a verl_ext plugin hook, verl_ext/plugin.py; VERL_USE_EXTERNAL_PLUGINS=none runs verl "
                   "without verl_ext)")
        logger.error(message)  # also where a caller swallows the exception
        raise PluginHookError(message) from e


def _execute(module: ModuleType, exec_module: Callable[[ModuleType], None]) -> None:
    """The module's code (inside its ``around`` hooks, the first registered outermost), then its other hooks."""
    hooks = list(_HOOKS.get(module.__name__, ()))
    run = exec_module
    for what, hook, around in reversed(hooks):
        if around:
            run = _around(module.__name__, what, hook, run)
    run(module)
    for what, hook, around in hooks:
        if not around:
            _run_hook(module.__name__, what, hook, False, module, lambda m: None)


def _around(module_name: str, what: str, hook: AroundHook, inner: Callable[[ModuleType], None]):
    def run(module: ModuleType) -> None:
        _run_hook(module_name, what, hook, True, module, inner)

    return run


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, then its hooks."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # give the module its own loader back before its code runs: it looks exactly as it would without the hook
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _execute(module, self._loader.exec_module)

    def __getattr__(self, name):  # get_source, is_package, get_resource_reader, ...: the original's
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name, wraps the loader of the spec the other finders return."""

    def __init__(self):
        self._searching: set[str] = set()  # names being looked up (the import lock serialises each name)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS or fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        if not hasattr(spec.loader, "exec_module"):  # a legacy loader: nothing to wrap
            logger.error("verl_ext cannot hook %s (its loader %r has no exec_module): %s will not happen",
                         fullname, spec.loader, "; ".join(what for what, _, _ in _HOOKS[fullname]))
            return spec
        if not isinstance(spec.loader, _HookedLoader):
            spec.loader = _HookedLoader(spec.loader)
        return spec


def _install_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


__all__ = ["PluginHookError", "watched", "when_imported"]
