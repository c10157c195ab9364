"""Data-parallel THOR on 2 CPU ranks through ``msrun`` (mccl backend, 127.0.0.1).

Both ranks must end with identical parameters, equal (rtol 1e-4) to one process trained on the
concatenated batch, with ``split_indices=[0]`` (two fusion groups), the default (one group) and
``trace_thresholds`` (the trace rule's decisions and state agree on both ranks and with one process).
This holds because the factors are mean-all-reduced: with the per-device normalisation
A = a^T a / B and G = B d^T d = (1/B) sum_i g_i g_i^T (d = g/B for the local mean loss), the mean of
the two ranks' factors is the factor of the 2B-sample batch, as the mean gradient is its gradient.
"""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
OPTIMIZER = "thor"
CONFIGS = ("split0", "default", "trace")

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    logs = out / "logs"
    single = subprocess.run([sys.executable, WORKER, "--out", str(out), "--optimizer", OPTIMIZER, "--single"],
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "--join=True", f"--log_dir={logs}",
           WORKER, "--out", str(out), "--optimizer", OPTIMIZER]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    worker_logs = "\n".join(_tail(str(logs / f"worker_{r}.log")) for r in range(2))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + worker_logs
    return out


@pytest.mark.parametrize("tag", CONFIGS)
def test_ranks_identical_and_equal_to_concatenated_batch(results, tag):
    rank0 = np.load(results / f"{tag}_rank0.npz")
    rank1 = np.load(results / f"{tag}_rank1.npz")
    single = np.load(results / f"{tag}_single.npz")
    names = [k for k in single.files if k != "__losses__"]
    assert set(names) == {k for k in rank0.files if k != "__losses__"}
    local_factors = [n for n in names if n.endswith(("matrix_a_cov", "matrix_g_cov"))]
    assert len(local_factors) == 6, local_factors  # conv, fc1, fc2: A and G each
    assert any("inv" in n for n in names), names  # the optimizer's inverses are compared too
    for name in names:
        if name in local_factors:
            # each layer keeps the factor of its rank's half batch (the optimizer all-reduces a copy):
            # the mean of the two is the factor of the concatenated batch, and it was collected
            assert np.abs(single[name]).sum() > 0, name
            np.testing.assert_allclose((rank0[name] + rank1[name]) / 2, single[name], rtol=1e-4, atol=1e-6,
                                       err_msg=name)
            continue
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-4, atol=1e-6, err_msg=name)
    if tag == "trace":  # THOR's trace rule: every rank decided from the all-reduced factors, as the single process
        counts = [int(single[f"thor_inversions_{i}"]) for i in range(3)]
        assert min(counts) >= 1 and sum(counts) < 3 * 3, counts  # 3 THOR steps: some layer skipped one
    # each rank saw half the batch: the mean of the two local losses is the concatenated batch's loss
    np.testing.assert_allclose((rank0["__losses__"] + rank1["__losses__"]) / 2, single["__losses__"], rtol=1e-4)
    # and the training really moved (the parameters are not at their initial values on both sides)
    assert not np.allclose(rank0["__losses__"][0], rank0["__losses__"][-1])


@pytest.mark.parametrize("tag, fusion", [("split0", [1, 2, 2]), ("default", [1, 1, 1])])
def test_factor_allreduce_mean_and_fusion_groups(results, tag, fusion):
    for rank in range(2):
        reduced = np.load(results / f"allreduce_{tag}_rank{rank}.npz")
        # rank r contributed (r+1)*(i+1) for layer i: the mean over 2 ranks is 1.5*(i+1)
        for i in range(3):
            np.testing.assert_allclose(reduced[f"arr_{i}"], np.full((2, 2), 1.5 * (i + 1)), rtol=0)
        np.testing.assert_array_equal(reduced["fusion"], fusion)
