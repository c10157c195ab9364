"""Shared fixtures: every numeric test runs in both MindSpore execution modes."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/: `reference` and `support` importable

import mindspore as ms  # noqa: E402

from ms_optim._bridge import prime_numpy_bridge  # noqa: E402

ms.set_context(device_target="CPU")


prime_numpy_bridge()  # MindSpore 2.10 + NumPy 2: take the bridge's one-time failure now (ms_optim._bridge)


@pytest.fixture(params=["pynative", "graph"])
def mode(request):
    """Run the test in PYNATIVE_MODE and in GRAPH_MODE on CPU; yields the mode name."""
    ms.set_context(mode=ms.PYNATIVE_MODE if request.param == "pynative" else ms.GRAPH_MODE,
                   device_target="CPU")
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture
def rng():
    """A seeded NumPy generator so every test draws the same data each run."""
    return np.random.default_rng(1234)


@pytest.fixture(params=["fused", "composite"])
def path(request, monkeypatch):
    """Run the test with the fused CPU kernels (ms_optim.optim._fused) and with the composite ops
    (used by test_lamb.py and test_lars.py; tests/support/fused_paths.py holds their shared checks)."""
    monkeypatch.setenv("MS_OPTIM_FUSED", "1" if request.param == "fused" else "0")
    return request.param
