"""Zoo-style loss-scale cells under ``ms_optim.use()`` on 2 CPU ranks through ``msrun``.

``loss_scale_worker.py`` trains 3 steps; step 2 has an inf only in rank 1's half of the batch. Both
ranks must report the overflow (all-reduced), skip that step (same parameters and optimizer state as
after step 1 plus step 3 only) and halve the scale; the ranks end identical and equal (rtol 1e-5) to one
process trained on the concatenated batches, in GRAPH and PYNATIVE mode, for the Bert-style cell with
MindSpore's Momentum and the clip-by-global-norm cell with ms_optim's Lamb.
"""
import os

import numpy as np
import pytest
from support.msrun import load_ranks_and_single, results_fixture

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "loss_scale_worker.py")
RUNS = [(kind, mode) for kind in ("bert", "global_norm") for mode in ("graph", "pynative")]

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


results = results_fixture(WORKER, "dp_loss_scale")


@pytest.mark.parametrize("kind, mode", RUNS)
def test_overflow_on_one_rank_skips_the_step_on_both(results, kind, mode):
    *ranks, single = load_ranks_and_single(results, f"{kind}_{mode}")
    # the scale: 1024, halved by the overflow of step 2 on every rank, then kept
    for got in ranks + [single]:
        np.testing.assert_array_equal(got["__scales__"], [1024.0, 512.0, 512.0])
        if kind == "bert":  # the cell's cond output: the overflow seen by rank 1 only, all-reduced
            np.testing.assert_array_equal(got["__overflows__"], [False, True, False])
    names = [k for k in single.files if not k.startswith("__")]
    assert set(names) == {k for k in ranks[0].files if not k.startswith("__")}
    assert any(n.endswith("global_step") for n in names)
    for name in names:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], single[name], rtol=1e-5, atol=1e-6, err_msg=name)
    step = next(n for n in names if n.endswith("global_step"))
    assert int(single[step].reshape(-1)[0]) == 2  # 3 steps, one skipped
