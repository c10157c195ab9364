"""``ms_optim.use()``: point MindSpore's own names at ms_optim's, so unmodified scripts run on CPU.

After ``use()`` a script that calls MindSpore's THOR, Lamb, LARS or ASGD, through ``import mindspore.nn
as nn``, ``from mindspore.nn import LARS``, ``ms.ConvertModelUtils`` or an import from the
``mindspore.train.train_thor`` package, gets ms_optim's implementation without any edit; so does one that
trains with loss scaling (``nn.TrainOneStepWithLossScaleCell``, a subclass of it, or ``Model`` with a
loss-scale manager, through ``mindspore.amp.build_train_network``). How:

* every module already in ``sys.modules`` whose name is ``mindspore`` or starts with ``mindspore.`` is
  scanned, and each attribute that *is* (identity) one of MindSpore's originals for a replaced name
  (``thor``, ``Lamb``, ``LARS``, ``ASGD``, ``DenseThor``, ``Conv2dThor``, ``EmbeddingThor``,
  ``ConvertModelUtils``, ``ConvertNetUtils``, ``ModelThor``, ``TrainOneStepWithLossScaleCell``,
  ``build_train_network``: the ``_EXPORTS`` tables of the facades) is set to ms_optim's object. This reaches
  the public namespaces (``mindspore``, ``mindspore.nn``, ``mindspore.train``,
  ``mindspore.train.train_thor``) and the modules behind them (``mindspore.nn.optim``,
  ``mindspore.train.train_thor.convert_utils``, ...), so ``import mindspore.nn as nn`` and
  ``from mindspore.nn.optim import thor`` both see the replacement;
* ``mindspore.train.train_thor.ModelThor`` is added (MindSpore keeps it one module deeper);
* a meta-path hook patches the same way every ``mindspore.*`` module imported while ``use()`` is active
  (``mindspore.train.train_thor.model_thor`` is imported only on demand), and records what it did.

``undo()`` (the handle's, or the context manager's exit, or ``ms_optim.undo_use()``) puts every recorded
attribute back, deleting the ones that did not exist, and removes the hook: MindSpore's namespaces are
then exactly as before. Names a script copied into its *own* globals before ``use()`` ran (``from
mindspore.nn import thor`` executed earlier) cannot be reached; ``python -m ms_optim.run`` calls
``use()`` before the script starts, so that case does not arise there.

``use(thor="adaptive")`` also points ``ms_optim.thor`` and ``ms_optim.nn.thor``, with MindSpore's
``thor`` names, at the recipe-free wrapper of ``ms_optim._thor_option``.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from ms_optim._thor_option import adaptive_thor, check_thor_mode

__all__ = ["use", "undo_use", "is_active", "UsePatch"]

_MISSING = object()

# The facades (module path of the facade, MindSpore namespace it stands in for): the names use()
# replaces are read from their ``_EXPORTS`` tables, never listed here.
_FACADES = (("ms_optim.nn", "mindspore.nn"), ("ms_optim.train_thor", "mindspore.train.train_thor"),
            ("ms_optim.amp", "mindspore.amp"))

# Modules where a *definition* of a replaced name (not only a re-export of a known original) is
# also replaced when it is imported under use(): MindSpore's implementation packages.
_DEFINING_PREFIXES = ("mindspore.nn.", "mindspore.train.")

# ms_optim's own public namespaces whose ``thor`` use(thor="adaptive") also replaces.
_OWN_THOR_HOMES = ("ms_optim", "ms_optim.nn")

# The namespaces a script names directly, in the order they are reported.
_PUBLIC_MODULES = ("mindspore.nn", "mindspore", "mindspore.train", "mindspore.train.train_thor",
                   "mindspore.amp")

_lock = threading.RLock()
_active: Optional["_Session"] = None


def _mindspore_original(home: str, name: str) -> Any:
    """MindSpore's object for ``name``: in its public namespace ``home``, else in a loaded ``home.*`` module
    that defines it (``ModelThor`` lives in ``mindspore.train.train_thor.model_thor``); _MISSING if none."""
    module = sys.modules.get(home)
    if module is not None and name in module.__dict__:
        return module.__dict__[name]
    for modname, module in list(sys.modules.items()):
        value = (getattr(module, "__dict__", {}).get(name, _MISSING) if modname.startswith(home + ".")
                 else _MISSING)
        if value is not _MISSING and getattr(value, "__module__", None) == modname:
            return value
    return _MISSING


def _ours() -> Dict[str, Tuple[Any, str]]:
    """name -> (ms_optim's object, MindSpore namespace) for every replaced name: each facade export that
    re-implements a MindSpore name (imports the implementations; raises ImportError if one fails).
    Ordered as the facades list them, the factory function ``thor`` before the classes."""
    import mindspore  # noqa: F401  (loads mindspore.nn, mindspore.train and train_thor)

    found = []
    for facade, home in _FACADES:
        table = importlib.import_module(facade)._EXPORTS
        for name, module_name in table.items():
            try:
                obj = getattr(importlib.import_module(module_name), name)
            except Exception as exc:  # report which implementation is missing, then stop before patching
                raise ImportError(f"ms_optim.use() cannot replace '{name}': importing {module_name} failed "
                                  f"({type(exc).__name__}: {exc})") from exc
            found.append((name, obj, home))
    found.sort(key=lambda item: isinstance(item[1], type))  # stable: table order within each kind
    return {name: (obj, home) for name, obj, home in found}


def _is_mindspore_module(name: str) -> bool:
    return name == "mindspore" or name.startswith("mindspore.")


class _Session:
    """One activation: what was replaced, so that undo restores it exactly.

    ``thor_mode`` is ``use()``'s ``thor`` (None or ``"adaptive"``), ``option`` how messages name it.
    """

    def __init__(self, table: Dict[str, Tuple[Any, str]], thor_mode: Optional[str] = None,
                 option: str = "ms_optim.use()", verbose: bool = True):
        self.ours = {name: obj for name, (obj, _) in table.items()}
        self.homes = {name: home for name, (_, home) in table.items()}
        self.thor_mode, self.option, self.verbose = thor_mode, option, verbose
        self.recipe_free = None
        if thor_mode is not None:
            self.recipe_free = adaptive_thor(self.ours["thor"], option, report=self.say)
            self.ours["thor"] = self.recipe_free
        # ms_optim's plain thor (replaced by the wrapper) is never mistaken for one of MindSpore's
        self.our_ids = {id(obj): name for name, (obj, _) in table.items()}
        self.our_ids.update({id(obj): name for name, obj in self.ours.items()})
        # name -> MindSpore's objects known for that name (usually one).
        self.originals: Dict[str, List[Any]] = {name: [] for name in self.ours}
        # (module, attribute, previous value or _MISSING), in the order applied.
        self.records: List[Tuple[ModuleType, str, Any]] = []
        self.hook: Optional[_PatchFinder] = None
        self.depth = 1

    # -- discovering MindSpore's originals -------------------------------------------------------
    def _add_original(self, name: str, obj: Any) -> None:
        if obj is _MISSING or id(obj) in self.our_ids:
            return
        if not any(obj is known for known in self.originals[name]):
            self.originals[name].append(obj)

    def collect_originals(self) -> None:
        for name, home in self.homes.items():
            self._add_original(name, _mindspore_original(home, name))

    # -- patching --------------------------------------------------------------------------------
    def _set(self, module: ModuleType, name: str, value: Any) -> None:
        self.records.append((module, name, module.__dict__.get(name, _MISSING)))
        setattr(module, name, value)

    def patch_module(self, module: ModuleType, newly_imported: bool = False) -> None:
        """Replace every attribute of ``module`` that is one of MindSpore's originals."""
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            return
        modname = getattr(module, "__name__", "")
        for name, ours in self.ours.items():
            value = namespace.get(name, _MISSING)
            if value is _MISSING or value is ours:
                if value is ours and newly_imported:
                    # Imported our object while active (e.g. `from mindspore.nn import Lamb` inside a
                    # module loaded now): undo must hand it MindSpore's object, as without use().
                    self.records.append((module, name, self.originals[name][0] if self.originals[name]
                                         else _MISSING))
                continue
            defined_here = (newly_imported and modname.startswith(_DEFINING_PREFIXES)
                            and getattr(value, "__module__", None) == modname
                            and getattr(value, "__name__", None) == name)
            if defined_here:
                self._add_original(name, value)
            if any(value is known for known in self.originals[name]):
                self._set(module, name, ours)

    def patch_all_loaded(self) -> None:
        for modname, module in list(sys.modules.items()):
            if _is_mindspore_module(modname) and isinstance(module, ModuleType):
                self.patch_module(module)
        # every replaced name is reachable from its public namespace (MindSpore keeps ModelThor one deeper)
        for name, home in self.homes.items():
            module = sys.modules.get(home)
            if module is not None and module.__dict__.get(name, _MISSING) is not self.ours[name]:
                self._set(module, name, self.ours[name])
        if self.recipe_free is not None:  # a script calling ms_optim.nn.thor / ms_optim.thor is served too
            for home in _OWN_THOR_HOMES:
                self._set(importlib.import_module(home), "thor", self.recipe_free)

    def install_hook(self) -> None:
        self.hook = _PatchFinder(self)
        sys.meta_path.insert(0, self.hook)

    def undo(self) -> None:
        if self.hook is not None:
            try:
                sys.meta_path.remove(self.hook)
            except ValueError:
                pass
            self.hook.session = None
            self.hook = None
        for module, name, previous in reversed(self.records):
            if previous is _MISSING:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, previous)
        self.records.clear()

    def finish(self) -> None:
        """End the activation: undo, and say so if the thor option never met a ``thor()`` call."""
        self.undo()
        atexit.unregister(self.notice_unused)
        self.notice_unused()

    # -- reporting -------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        if self.verbose:
            print(line, file=sys.stderr, flush=True)

    def notice_unused(self) -> None:
        """One line if ``thor="adaptive"`` was given and no ``thor()`` call was made (at most once)."""
        if self.recipe_free is not None and self.recipe_free.calls == 0:
            self.recipe_free.calls = -1  # said once
            self.say(f"{self.option}: no thor() call was made, so the option had no effect.")

    def summary(self) -> str:
        by_module: Dict[str, List[str]] = {}
        records = [record for record in self.records if _is_mindspore_module(record[0].__name__)]
        for module, name, _ in records:
            modname = module.__name__
            names = by_module.setdefault(modname, [])
            if name not in names:
                names.append(name)
        public = [f"{m}.{{{', '.join(by_module[m])}}}" for m in _PUBLIC_MODULES if m in by_module]
        others = len(records) - sum(len(by_module[m]) for m in _PUBLIC_MODULES if m in by_module)
        text = "ms_optim.use(): " + ", ".join(public) + " now point at ms_optim"
        if others:
            text += f" (and {others} more references inside mindspore.*)"
        return text + "; ms_optim.undo_use() restores MindSpore's."


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the fresh module; leaves the real loader on the module."""

    def __init__(self, inner: importlib.abc.Loader, finder: "_PatchFinder"):
        self.inner = inner
        self.finder = finder

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps the real loader (get_source, resources, reload), as without the hook.
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.inner
        module.__loader__ = self.inner
        self.inner.exec_module(module)
        session = self.finder.session
        if session is not None:
            with _lock:
                session.patch_module(module, newly_imported=True)


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Meta-path hook active during use(): wraps the loader of every ``mindspore.*`` import."""

    def __init__(self, session: _Session):
        self.session: Optional[_Session] = session
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if self.session is None or not _is_mindspore_module(fullname) or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec


class UsePatch:
    """Handle returned by :func:`use`; ``undo()`` or leaving a ``with`` block ends this activation.

    A handle belongs to the activation it was made in: once that one has ended (by :func:`undo_use`),
    its ``undo()`` does nothing, so it cannot end a newer activation.
    """

    def __init__(self, session: "_Session") -> None:
        self._session = session
        self._done = False

    def undo(self) -> None:
        """End this activation; MindSpore's names come back when the last activation ends."""
        global _active
        with _lock:
            if self._done:
                return
            self._done = True
            if _active is None or _active is not self._session:
                return
            _active.depth -= 1
            if _active.depth == 0:
                _active.finish()
                _active = None

    def __enter__(self) -> "UsePatch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.undo()


def use(verbose: bool = True, *, thor: Optional[str] = None) -> UsePatch:
    """Point MindSpore's THOR, Lamb, LARS, ASGD and loss-scale training names at ms_optim's implementations.

    Replaces ``mindspore.nn.{thor, Lamb, LARS, ASGD, DenseThor, Conv2dThor, EmbeddingThor,
    TrainOneStepWithLossScaleCell}``, ``mindspore.amp.build_train_network`` (which ``Model`` calls),
    ``mindspore.{ConvertModelUtils, ConvertNetUtils}``, ``mindspore.train.{ConvertModelUtils,
    ConvertNetUtils}`` and ``mindspore.train.train_thor.{ConvertModelUtils, ConvertNetUtils, ModelThor}``
    (and every other reference to those objects inside ``mindspore.*``, including modules imported
    later). Prints one line saying what it replaced (to stderr, unless ``verbose=False``).

    ``thor="adaptive"`` (keyword-only; ``python -m ms_optim.run --thor adaptive``) also makes every
    ``thor()`` call recipe-free, through MindSpore's names and ms_optim's (``ms_optim.thor``,
    ``ms_optim.nn.thor``) alike: it is made with ``learning_rate="adaptive"`` and ``damping="adaptive"`` in
    place of the script's schedules, which are not read, and every other argument as given (momentum,
    weight decay, loss scale, batch size, decay filter, split indices, clipping, frequency, keywords).
    Each call prints one line saying what was replaced; if the activation ends, or the process exits,
    without a ``thor()`` call, one line says the option had no effect (both unless ``verbose=False``). A
    call adaptive THOR cannot serve (``use_nesterov=True``, ``momentum`` 1.0 or more) raises ``ValueError``
    naming the option. Step the optimizer with ``ModelThor`` (``convert_to_thor_model``) or ms_optim's
    training cells. Default: None (``thor()`` calls are made as written).

    Use as a function (``patch = ms_optim.use(); ...; patch.undo()``) or as a context manager
    (``with ms_optim.use(): ...``). Calls nest: MindSpore's names come back when the outermost
    activation ends, or at once with :func:`undo_use`. A nested call joins the active activation: with
    ``thor=None`` whatever its ``thor``, with ``thor="adaptive"`` only if that is the active one's too
    (a nested call cannot change how ``thor()`` calls are made).

    Raises:
        TypeError: if ``verbose`` is not a bool; if ``thor`` is not None or a str.
        ValueError: if ``thor`` is a str other than ``"adaptive"``; if ``thor`` is given while an activation
            with another ``thor`` is active (nothing changes).
        ImportError: if one of ms_optim's implementations cannot be imported (nothing is patched).
    """
    return activate(verbose, thor, f"ms_optim.use(thor={thor!r})")


def activate(verbose: bool = True, thor: Optional[str] = None, option: str = "ms_optim.use()") -> UsePatch:
    """:func:`use`, with ``option`` naming the thor option in messages (``python -m ms_optim.run`` passes
    its own spelling)."""
    from ms_optim._validation import check_bool

    global _active
    check_bool("verbose", verbose, "use")
    check_thor_mode(thor, "use")
    with _lock:
        if _active is not None:
            if thor is not None and thor != _active.thor_mode:
                raise ValueError(f"For 'use', the argument 'thor' must be None or the active activation's "
                                 f"({_active.thor_mode!r}) in a nested call, but got {thor!r}: a nested "
                                 f"activation cannot change how thor() calls are made; end the active one "
                                 f"first (ms_optim.undo_use()).")
            _active.depth += 1
            return UsePatch(_active)
        session = _Session(_ours(), thor, option, verbose)
        session.collect_originals()
        try:
            session.patch_all_loaded()
            session.install_hook()
        except BaseException:
            session.undo()
            raise
        _active = session
        if session.recipe_free is not None:
            atexit.register(session.notice_unused)
        if verbose:
            print(session.summary(), file=sys.stderr, flush=True)
        return UsePatch(session)


def undo_use() -> bool:
    """Restore MindSpore's names now, whatever the nesting depth; returns whether anything was active."""
    global _active
    with _lock:
        if _active is None:
            return False
        _active.finish()
        _active = None
        return True


def is_active() -> bool:
    """Whether MindSpore's names currently point at ms_optim's."""
    return _active is not None
