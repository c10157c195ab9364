"""Helpers shared by tests/optim/test_lamb.py and test_lars.py: both check the fused-kernel and the
composite path of the same optimizers against float64 references with the same tolerances.
Their `path` fixture (fused / composite) is in conftest.py."""
from ms_optim.optim import _fused

RTOL = 1e-4
# Elements that the update carries close to 0 from |w| ~ 1 keep float32's absolute rounding
# (~1e-7 per op), which no relative tolerance covers; a wrong update moves w by ~lr*|w| >> 1e-6.
ATOL_W = 1e-6


def expect_path(opt, path):
    """The optimizer took the path asked for (fused only where the kernels could be built)."""
    assert opt.use_fused == (path == "fused" and _fused.lamb_op() is not None), _fused._failed

