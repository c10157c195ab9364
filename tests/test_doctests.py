"""Every example in a public docstring runs as a doctest.

The public names are read from the facades' export tables (``ms_optim._EXPORTS``, which includes
``ms_optim.nn`` and ``ms_optim.train_thor``, plus ``use``/``undo_use``), so an implementation moved to
another module is still found. Each public object's docstring, and the docstrings of its methods and
properties defined in the same module, are searched; objects without examples contribute nothing.
"""
from __future__ import annotations

import doctest
import importlib
import io
from typing import List, Tuple, Union

import pytest

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)

FACADES = ("ms_optim.nn", "ms_optim.train_thor", "ms_optim")  # most specific first: names as users write them
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def public_objects() -> List[Tuple[str, object]]:
    """(public name, object) for every name in the facades' export tables, each object once."""
    seen = {}
    for facade_name in FACADES:
        facade = importlib.import_module(facade_name)
        for name, module_name in sorted(facade._EXPORTS.items()):
            obj = getattr(importlib.import_module(module_name), name)
            seen.setdefault(id(obj), (f"{facade_name}.{name}", obj))
    return list(seen.values())


def collect() -> List[Union[doctest.DocTest, Tuple[str, str]]]:
    """The doctests of the facades' own docstrings and of every public object (examples only).

    A docstring the doctest parser rejects (e.g. inconsistent indentation in an example) becomes a
    ``(name, error)`` entry, so it fails as its own test instead of stopping the collection.
    """
    found: List[Union[doctest.DocTest, Tuple[str, str]]] = []
    finder = doctest.DocTestFinder(exclude_empty=True)
    targets = [(name, importlib.import_module(name), False) for name in FACADES]
    targets += [(public_name, obj, True) for public_name, obj in public_objects()]
    for name, obj, recurse in targets:
        try:
            tests = (finder if recurse else doctest.DocTestFinder(recurse=False, exclude_empty=True)).find(obj, name)
        except ValueError as exc:
            found.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        found += [t for t in tests if t.examples]
    return sorted(found, key=lambda t: t[0] if isinstance(t, tuple) else t.name)


def run_doctest(test: doctest.DocTest) -> Tuple[int, str]:
    """Run one doctest; return (number of failed examples, the runner's report)."""
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=out.write)
    return result.failed, out.getvalue()


DOCTESTS = collect()


@pytest.mark.parametrize("test", DOCTESTS, ids=[t[0] if isinstance(t, tuple) else t.name for t in DOCTESTS])
def test_docstring_example_runs(test):
    assert not isinstance(test, tuple), f"the docstring of {test[0]} cannot be parsed as a doctest: {test[1]}"
    failed, report = run_doctest(test)
    assert failed == 0, report


def test_collector_follows_the_export_tables():
    objects = public_objects()
    collected = {id(obj) for _, obj in objects}
    for facade_name in FACADES:
        facade = importlib.import_module(facade_name)
        for name in facade._EXPORTS:
            assert id(getattr(facade, name)) in collected, f"{facade_name}.{name}"
    names = {public for public, _ in objects}
    assert {"ms_optim.nn.Lamb", "ms_optim.train_thor.ConvertModelUtils", "ms_optim.use"} <= names
    found = {(t[0] if isinstance(t, tuple) else t.name).split(".")[-1] for t in DOCTESTS}
    assert {"Lamb", "LARS", "ASGD"} <= found, found


def test_a_wrong_example_is_reported_as_a_failure():
    parser = doctest.DocTestParser()
    bad = parser.get_doctest(">>> 1 + 1\n3\n", {}, "bad_example", None, 0)
    failed, report = run_doctest(bad)
    assert failed == 1 and "Expected" in report
