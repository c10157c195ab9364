"""THOR's adaptive rules on 2 CPU ranks through ``msrun`` (``adaptive_worker.py``): ``damping="adaptive"``,
``learning_rate="adaptive"`` and both, in GRAPH and PYNATIVE mode.

The ranks must decide alike: the same damping and, with the adaptive learning rate, the same step size,
momentum and calibration on every step, and the same parameters and optimizer state at the end, bit for bit
(every rank's losses, q and factors are its own: the rules average them over the ranks before deciding; with
the adaptive learning rate the damping rule's predicted change comes from the averaged 2x2 system, so it is
the same on every rank too). Where the single
process on the concatenated batch is the same computation, it must give the same numbers: on the ``"twin"``
batches (both halves the same samples) each rank's factors are the concatenated batch's, so the rank mean of
any function of them is that function of the concatenated batch's factors. On ``"split"`` batches it is not:
the initial-damping heuristic and the quadratic model take the mean over ranks of products of each rank's own
A and G, not the product of the means (``ms_optim._thor.step.quadratic_rule``, "Data parallel"), so only the first
step's loss is compared there.
"""
import os
import sys

import numpy as np
import pytest
from reference.thor_adaptive_ref import FAILED_RATIO
from support.adaptive_lr_checks import calibrated_damping_after
from support.msrun import load_ranks_and_single, results_fixture

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import adaptive_worker  # noqa: E402  (its runs and data)

WORKER = os.path.join(HERE, "adaptive_worker.py")
TAGS = [(run, data, mode) for run in sorted(adaptive_worker.RUNS) for data in adaptive_worker.DATA
        for mode in ("graph", "pynative")]
LOCAL = ("matrix_a_cov", "matrix_g_cov")  # each rank keeps its own batch's factors (the optimizer reduces a copy)
#: per rank by design: its own losses, and, with a learning-rate Tensor, the q of its own factors
#: (``thor_predicted_change``, averaged into the reduction ratio, not in place)
PER_RANK = ("__losses__", "thor_predicted_change")

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


results = results_fixture(WORKER, "dp_adaptive", timeout=600)


def _load(results, run, data, mode):
    return load_ranks_and_single(results, f"{run}_{data}_{mode}")


def _check_calibrated_damping(dampings, ratios):
    """Every adaptation step's decision (``adapt_every=2``: steps 1, 3, 5) from its ratio, shared by the ranks:
    ``d / omega`` below 1/4, ``max(d * omega, first step's d)`` above 3/4, else ``d``; no change in between."""
    omega = np.float32(0.95 ** 2)
    assert np.all(np.isfinite(ratios)) and np.all(ratios > FAILED_RATIO), ratios  # every ratio a measurement
    for s in range(1, len(dampings)):
        before, ratio = dampings[s - 1], ratios[s]
        expected = before if s % 2 == 0 else calibrated_damping_after(before, ratio, dampings[0], omega)
        np.testing.assert_allclose(dampings[s], expected, rtol=1e-6, err_msg=f"step {s}, ratio {ratio}")


@pytest.mark.parametrize("run, data, mode", TAGS)
def test_ranks_decide_alike(results, run, data, mode):
    rank0, rank1, single = _load(results, run, data, mode)
    names = set(single.files)
    assert names == set(rank0.files) == set(rank1.files)
    learning_rate, damping = adaptive_worker.RUNS[run]
    per_rank = ("__losses__",) if learning_rate == "adaptive" else PER_RANK
    shared = [n for n in names if not n.endswith(LOCAL) and n not in per_rank]
    for name in shared:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    if damping == "adaptive":
        assert "thor_damping" in shared and "thor_reduction_ratio" in shared
        if learning_rate == "adaptive":  # a rule whose damping stays at its start while the trials deliver
            _check_calibrated_damping(rank0["__dampings__"], rank0["__ratios__"])
        else:
            assert len(set(rank0["__dampings__"])) > 1, rank0["__dampings__"]
    if learning_rate == "adaptive":
        assert "thor_step_size" in shared and len(rank0["__alphas__"]) == adaptive_worker.STEPS
        betas = rank0["__betas__"]
        if adaptive_worker.MOMENTUM[run] == "adaptive":  # the 2x2 solve: the 1-D step first, then both
            assert betas[0] == 0.0 and np.any(betas[1:] != 0.0), betas
        else:  # the averaged step: beta is the momentum on every step kept
            assert np.all((betas == np.float32(0.9)) | (betas == 0.0)) and np.sum(betas != 0.0) > 1, betas
        assert "thor_curvature_calibration" in shared and "thor_system" in shared
        assert np.all(rank0["__kappas__"] != 1.0), rank0["__kappas__"]  # measured on every step
    for got in (rank0, rank1):
        assert all(np.all(np.isfinite(got[n])) for n in names if got[n].dtype.kind == "f"), run
    if data == "split":  # the halves differ: so do the factors the ranks keep
        assert any(not np.array_equal(rank0[n], rank1[n]) for n in names if n.endswith(LOCAL))
    # each rank's loss is its half's; the first step's (the same parameters everywhere) is exact
    np.testing.assert_allclose((rank0["__losses__"][0] + rank1["__losses__"][0]) / 2, single["__losses__"][0],
                               rtol=1e-5)


@pytest.mark.parametrize("run, mode", [(run, mode) for run, data, mode in TAGS if data == "twin"])
def test_twin_halves_equal_the_single_process(results, run, mode):
    """Both halves the same samples: data parallel is the single process on the concatenated batch."""
    rank0, rank1, single = _load(results, run, "twin", mode)
    for name in single.files:
        if name == "__losses__":  # each rank's loss is its half's, which here is the whole batch's
            for got in (rank0, rank1):
                np.testing.assert_allclose(got[name], single[name], rtol=1e-4, err_msg=name)
            continue
        # float32 sums in another order (two halves all-reduced vs one batch), carried through six solves of
        # the 2x2 system: atol 1e-5 on parameters of size ~1 (an entry near 0 of conv.weight differs by 2e-6)
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert not np.allclose(single["__losses__"][0], single["__losses__"][-1])  # training moved
