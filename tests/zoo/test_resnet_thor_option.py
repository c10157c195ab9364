"""The ResNet zoo's THOR config run through ``python -m ms_optim.run --thor adaptive``: the zoo's own
``ms_optim.nn.thor`` call with its lr and damping schedules builds recipe-free THOR, which trains.

ResNet-18 at width 4 on 16x16 crops of generated CIFAR-10 binaries, batch 8, 4 epochs of 10 steps (about
20 s): the option's stderr line names the replaced schedules, the checkpoint holds adaptive THOR's state
(the damping it chose, the step sizes, the config's momentum 0.9, no lr schedule) and the loss, finite at
every step, falls epoch after epoch.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from support import REPO
from support.zoo_data import CONFIGS, TRAIN, write_cifar10

ARGS = ["--device_target", "CPU", "--width=4", "--image_size=16", "--batch_size=8", "--num_parallel_workers=1",
        "--log_interval=1", "--stem=cifar", "--class_num=10", "--frequency=3", "--split_indices=10,20",
        "--epoch_size=4", "--steps_per_epoch=10"]
OPTION = "python -m ms_optim.run --thor adaptive"


@pytest.mark.slow
def test_zoo_thor_config_trains_recipe_free_under_the_option(tmp_path):
    import mindspore as ms

    data = write_cifar10(str(tmp_path / "cifar"), test=0)
    out = tmp_path / "out"
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", "--thor", "adaptive", TRAIN, "--config_path",
                           os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml"), "--data_path", data, "--output_dir",
                           str(out), *ARGS], capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=600)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    # the zoo's two per-step schedules, both replaced; momentum and the rest as configured
    lines = [line for line in proc.stderr.splitlines() if line.startswith(OPTION)]
    expected = (f"{OPTION}: thor() builds recipe-free THOR: learning_rate Tensor of shape (N,) and damping Tensor "
                f"of shape (N,) replaced by 'adaptive' (not read); momentum=0.9 and the other arguments as given.")
    assert len(lines) == 1 and re.fullmatch(re.escape(expected).replace("N", r"\d+"), lines[0]), lines

    state = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(out / "ckpt_0" / "resnet18-4_10.ckpt")).items()}
    assert int(state["global_step"].reshape(-1)[0]) == 40
    assert state["learning_rate"].shape in ((), (1,))  # no lr schedule in the optimizer
    assert float(state["thor_damping"].reshape(-1)[0]) > 0  # chosen by the adaptive rule (it starts at -1)
    assert float(state["thor_momentum_coefficient"].reshape(-1)[0]) == pytest.approx(0.9)
    assert np.isfinite(float(state["thor_step_size"].reshape(-1)[0]))

    losses = [float(x) for x in re.findall(r"\(global \d+\) loss ([0-9.eEinfa+-]+)", proc.stdout)]
    assert len(losses) == 40 and np.all(np.isfinite(losses)), proc.stdout[-3000:]
    means = [float(np.mean(losses[i:i + 10])) for i in range(0, 40, 10)]
    assert all(b < a for a, b in zip(means, means[1:])), means
    assert means[-1] < 0.75 * means[0], means
