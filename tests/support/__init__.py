"""Shared nets, data and helpers of ms_optim's tests, importable as ``support``.

tests/conftest.py puts tests/ on ``sys.path`` (so ``support`` and ``reference``, the NumPy oracles, import
by name); the scripts the tests run as subprocesses do the same. Test modules import from here and from
``reference``, never from one another.
"""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's root
