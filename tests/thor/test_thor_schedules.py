"""THOR's learning-rate and damping generators against the model zoo's formulas, step by step."""
import math

import numpy as np
import pytest
from mindspore import Tensor

from ms_optim._thor.schedules import get_thor_damping, get_thor_lr


def _lr_reference(global_step, lr_init, decay, total_epochs, steps_per_epoch, decay_epochs):
    out = []
    for s in range(global_step, total_epochs * steps_per_epoch):
        e = (s + 1) / steps_per_epoch
        v = lr_init * (1.0 - e / total_epochs) ** decay
        if e >= decay_epochs:
            v *= 0.5
        if e >= decay_epochs + 1:
            v *= 0.5
        out.append(v)
    return np.array(out, dtype=np.float64)


def _damping_reference(global_step, damping_init, decay_rate, total_epochs, steps_per_epoch):
    return np.array([damping_init * decay_rate ** (((s + 1) / steps_per_epoch) / 10)
                     for s in range(global_step, total_epochs * steps_per_epoch)], dtype=np.float64)


@pytest.mark.parametrize("args", [
    (0, 0.05803, 4.04839, 53, 7, 39),      # the model zoo's ResNet-50 THOR settings, 7 steps/epoch
    (0, 0.1, 2.0, 5, 3, 2),                # both halvings inside the schedule
    (11, 0.2, 1.0, 4, 5, 100),             # resumed mid-schedule, no halving
    (0, 1.0, 0.5, 3, 4, 2.5),              # fractional decay epoch
])
def test_lr_matches_formula(args):
    lr = get_thor_lr(*args)
    ref = _lr_reference(*args)
    assert lr.dtype == np.float32 and lr.shape == ref.shape
    np.testing.assert_allclose(lr, ref, rtol=1e-6, atol=1e-12)
    assert lr[-1] == 0.0  # the rate reaches 0 at the last step of total_epochs


def test_lr_halving_points():
    lr = get_thor_lr(0, 1.0, 0.0, 6, 2, decay_epochs=2)  # decay 0: only the halvings remain
    # epochs (s+1)/2 = 0.5, 1, 1.5, 2, 2.5, 3, 3.5, ...
    np.testing.assert_array_equal(lr[:3], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(lr[3:5], [0.5, 0.5])
    np.testing.assert_array_equal(lr[5:12], [0.25] * 7)  # last step: 0**0 == 1, as in the model zoo
    assert lr.shape == (12,)


@pytest.mark.parametrize("args", [(0, 0.03, 0.87, 70, 9), (5, 0.5, 0.3, 3, 4), (0, 1e-3, 1.0, 2, 1)])
def test_damping_matches_formula(args):
    d = get_thor_damping(*args)
    ref = _damping_reference(*args)
    assert d.dtype == np.float32 and d.shape == ref.shape
    np.testing.assert_allclose(d, ref, rtol=1e-6)


def test_as_tensor():
    lr = get_thor_lr(0, 0.1, 2.0, 3, 4, as_tensor=True)
    damping = get_thor_damping(0, 0.03, 0.87, 3, 4, as_tensor=True)
    assert isinstance(lr, Tensor) and isinstance(damping, Tensor)
    assert lr.shape == (12,) and damping.shape == (12,)
    np.testing.assert_array_equal(lr.asnumpy(), get_thor_lr(0, 0.1, 2.0, 3, 4))
    assert math.isclose(float(damping.asnumpy()[0]), 0.03 * 0.87 ** (0.25 / 10), rel_tol=1e-6)


@pytest.mark.parametrize("call, exc, name", [
    (lambda: get_thor_lr(0, "0.1", 2.0, 3, 4), TypeError, "lr_init"),
    (lambda: get_thor_lr(0, 0.1, 2.0, 3.0, 4), TypeError, "total_epochs"),
    (lambda: get_thor_lr(0, 0.1, 2.0, 0, 4), ValueError, "total_epochs"),
    (lambda: get_thor_lr(0, 0.1, 2.0, 3, 0), ValueError, "steps_per_epoch"),
    (lambda: get_thor_lr(12, 0.1, 2.0, 3, 4), ValueError, "global_step"),
    (lambda: get_thor_lr(-1, 0.1, 2.0, 3, 4), ValueError, "global_step"),
    (lambda: get_thor_lr(0, -0.1, 2.0, 3, 4), ValueError, "lr_init"),
    (lambda: get_thor_lr(0, 0.1, True, 3, 4), TypeError, "decay"),
    (lambda: get_thor_damping(0, 0.03, 0.0, 3, 4), ValueError, "decay_rate"),
    (lambda: get_thor_damping(0, None, 0.87, 3, 4), TypeError, "damping_init"),
])
def test_bad_arguments(call, exc, name):
    with pytest.raises(exc, match=f"'{name}'"):
        call()
