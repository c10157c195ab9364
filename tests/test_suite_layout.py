"""The test suite's own rules: shared code lives in ``support`` (or ``reference``, the oracles), so no module
under tests/ imports a test module; and test files have unique basenames across the folders (pytest's
default import mode puts each test folder on ``sys.path`` and imports a file by its basename)."""
import ast
import collections
import os

from support import REPO

TESTS = os.path.join(REPO, "tests")


def _python_files():
    for folder, _, files in os.walk(TESTS):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def _imported_modules(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_no_module_imports_a_test_module():
    found = [(os.path.relpath(path, TESTS), module) for path in _python_files()
             for module in _imported_modules(path) if module.split(".")[-1].startswith("test_")]
    assert found == [], found


def test_test_file_basenames_are_unique():
    by_name = collections.defaultdict(list)
    for path in _python_files():
        if os.path.basename(path).startswith("test_"):
            by_name[os.path.basename(path)].append(os.path.relpath(path, TESTS))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
