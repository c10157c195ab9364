"""Helpers shared by test_lamb.py and test_lars.py: both check the fused-kernel and the composite path
of the same optimizers against float64 references with the same tolerances.
Their `path` fixture (fused / composite) is in conftest.py."""
import numpy as np
from mindspore import Parameter, Tensor

from ms_optim.optim import _fused

RTOL = 1e-4
# Elements that the update carries close to 0 from |w| ~ 1 keep float32's absolute rounding
# (~1e-7 per op), which no relative tolerance covers; a wrong update moves w by ~lr*|w| >> 1e-6.
ATOL_W = 1e-6


def expect_path(opt, path):
    """The optimizer took the path asked for (fused only where the kernels could be built)."""
    assert opt.use_fused == (path == "fused" and _fused.lamb_op() is not None), _fused._failed


def make_params(rng, spec):
    """spec: list of (name, shape, zero_init) -> (Parameters, float32 arrays)."""
    arrays = [np.zeros(shape, np.float32) if zero else rng.standard_normal(shape).astype(np.float32)
              for _, shape, zero in spec]
    return [Parameter(Tensor(a.copy()), name=n) for (n, _, _), a in zip(spec, arrays)], arrays
