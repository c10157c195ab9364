"""The harness of the data-parallel tests, which start 2 CPU ranks through ``msrun`` on 127.0.0.1."""
import os
import socket
import subprocess
import sys
from typing import Optional, Sequence, Tuple

import numpy as np


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for msrun's ``--master_port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: str, n: int = 40) -> str:
    """The last ``n`` lines of a worker's log ("" if it was never written), for a failure message."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def run_single_and_two_ranks(worker: str, out: str, args: Sequence[str] = (), timeout: int = 300) -> None:
    """Run ``worker`` (a script taking ``--out OUT [--single]`` and ``args``) once as one process on the whole
    batch (``--single``), then on 2 ``msrun`` ranks; both write their results under ``out``. Asserts each
    succeeded, with its output (and the ranks' log tails) as the failure message."""
    base = [worker, "--out", str(out), *args]
    single = subprocess.run([sys.executable, *base, "--single"], capture_output=True, text=True, timeout=timeout)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    logs = os.path.join(str(out), "logs")
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={logs}", *base]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    worker_logs = "\n".join(tail(os.path.join(logs, f"worker_{r}.log")) for r in range(2))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + worker_logs


def state_file(out: str, tag: str, rank: Optional[int] = None) -> str:
    """Where a worker writes the state of run ``tag``: ``OUT/<tag>_rank<r>.npz`` on rank ``r`` under msrun,
    ``OUT/<tag>_single.npz`` alone (``rank`` None)."""
    return os.path.join(str(out), f"{tag}_single.npz" if rank is None else f"{tag}_rank{rank}.npz")


def load_ranks_and_single(out: str, tag: str) -> Tuple:
    """The states of run ``tag`` written by rank 0, rank 1 and the single process (:func:`state_file`)."""
    return tuple(np.load(state_file(out, tag, rank)) for rank in (0, 1, None))


def results_fixture(worker: str, name: str, args: Sequence[str] = (), timeout: int = 300):
    """A module-scoped pytest fixture: a fresh folder ``name`` where :func:`run_single_and_two_ranks` ran
    ``worker`` (with ``args``) alone and on 2 ranks. Assign it to a module-level name to use it."""
    import pytest  # here: the workers import this module for state_file, without pytest's start-up

    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        out = tmp_path_factory.mktemp(name)
        run_single_and_two_ranks(worker, out, args, timeout=timeout)
        return out

    return results
