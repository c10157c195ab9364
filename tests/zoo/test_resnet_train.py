"""ResNet zoo end to end on tiny generated data in the real on-disk formats (CIFAR-10 binary batches,
ImageFolder PNG trees): the published architectures build and convert (ResNet-50: 54 THOR layers, so
split_indices [26, 53] is valid), standalone THOR and Momentum training + eval through train.py/eval.py
and the launchers, exact resume from a mid-run (mid-epoch, mid-THOR-cycle) checkpoint, and 2 msrun
CPU workers ending with identical checkpoints.

Training runs use ResNet-18 at width 4 on 16x16 crops, batch 4, a few steps: the code paths are the
real ones, the sizes keep the module short. Every THOR run here builds the same network graph (CIFAR
stem, 10 classes, also for the ImageFolder data), and the runs share MindSpore's compile cache
(MS_COMPILER_CACHE_*), so the THOR graph is compiled once, not once per process. The one run with other
THOR options (inverse, trace rule, shared inversions) builds another graph and must not read that
cache: MindSpore does not see the options in its cache key and replays the stale graph (it failed
with "For 'Assign', memcpy size must be less than or equal to max size").
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from support.zoo_data import CONFIGS, EVAL, SCRIPTS, TRAIN, write_cifar10, write_image_folder

TINY = ["--width=4", "--image_size=16", "--batch_size=4", "--eval_batch_size=4", "--num_parallel_workers=1",
        "--log_interval=1", "--stem=cifar", "--class_num=10"]
THOR_ARGS = ["--frequency=3", "--split_indices=10,20"]
THOR_CIFAR = os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml")
MOM_CIFAR = os.path.join(CONFIGS, "resnet18_cifar10_momentum.yaml")


_CACHE = {}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_train_data")
    _CACHE["path"] = str(root / "compile_cache")
    return {"cifar": write_cifar10(str(root / "cifar")),
            "images": write_image_folder(str(root / "images"), per_class=4, classes=10, size=24),
            "images_val": write_image_folder(str(root / "images_val"), per_class=1, classes=10, size=24, seed=1)}


def _run(cmd, cwd, env=None, timeout=300):
    cache = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": _CACHE["path"]} if _CACHE else {}
    proc = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHON=sys.executable, **{**cache, **(env or {})}))
    assert proc.returncode == 0, f"{cmd}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc.stdout


def _train(config, data_path, out, *extra, cwd):
    return _run([sys.executable, TRAIN, "--config_path", config, "--data_path", data_path, "--output_dir", str(out),
                 "--device_target", "CPU", *TINY, *extra], cwd)


def _ckpt(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _assert_same_state(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _eval(config, data_path, ckpt, cwd, *extra):
    out = _run([sys.executable, EVAL, "--config_path", config, "--data_path", data_path, "--checkpoint_path",
                str(ckpt), "--device_target", "CPU", *TINY, *extra], cwd)
    match = re.search(r"top1 ([0-9.]+) top5 ([0-9.]+) images (\d+)", out)
    assert match, out
    top1, top5, images = float(match[1]), float(match[2]), int(match[3])
    assert 0.0 <= top1 <= top5 <= 1.0
    return top1, top5, images


@pytest.mark.slow
def test_published_architectures_build_and_convert():
    """Parameter counts of the real networks (torchvision's for 1000 classes) and ResNet-50's 54 THOR
    layers: thor() accepts split_indices [26, 53], and on one device also an index past the last layer
    (MindSpore's thor reads split_indices only in data parallel; tests/thor/test_thor_accepts.py)."""
    import mindspore as ms
    from mindspore import Tensor

    from model_zoo.resnet.src.resnet import build_resnet
    from ms_optim import nn as thor_nn
    from ms_optim._thor.net.layers import ThorLayer

    expected = {("resnet18", 1000): 11689512, ("resnet34", 1000): 21797672, ("resnet50", 1000): 25557032,
                ("resnet50", 1001): 25559081, ("resnet101", 1000): 44549160}
    for (name, classes), count in expected.items():
        net = build_resnet(name, class_num=classes)
        assert sum(int(np.prod(p.shape)) for p in net.trainable_params()) == count, name
    net = build_resnet("resnet50", class_num=1001)
    assert net(Tensor(np.zeros((1, 3, 64, 64), np.float32))).shape == (1, 1001)
    plain = {p.name: p.asnumpy() for p in net.trainable_params()}
    lr, damping = Tensor(np.full(4, 0.01, np.float32)), Tensor(np.full(4, 0.03, np.float32))
    assert thor_nn.thor(net, lr, damping, 0.9, 5e-4, 128.0, 32, split_indices=[26, 54], frequency=834).split_indices \
        == [26, 54]
    opt = thor_nn.thor(net, lr, damping, 0.9, 5e-4, 128.0, 32, split_indices=[26, 53], frequency=834)
    layers = [cell for _, cell in net.cells_and_names() if isinstance(cell, ThorLayer)]
    assert len(layers) == 54 and [layer.kind for layer in layers].count("conv") == 53
    assert {p.name: p.asnumpy().shape for p in net.trainable_params()} == {k: v.shape for k, v in plain.items()}
    assert opt is not None
    del ms


@pytest.mark.slow
def test_thor_cifar_resume_is_exact_and_eval(tmp_path, data):
    """THOR (frequency 3) on CIFAR-10 binaries: 3 epochs x 3 steps; a run resumed from the step-4
    checkpoint (mid-epoch, mid-THOR-cycle) ends with exactly the same weights, factors, inverses,
    momenta and step counter as the uninterrupted run; eval reports top-1/top-5."""
    extra = [*THOR_ARGS, "--epoch_size=3", "--steps_per_epoch=3", "--save_checkpoint_steps=2"]
    full = _train(THOR_CIFAR, data["cifar"], tmp_path / "full", *extra, cwd=tmp_path)
    assert re.search(r"epoch 1/3 step 1/3 \(global 1\) loss [0-9.]+ lr [0-9.]+ step [0-9.]+ ms images/s", full)
    assert "epoch 3/3 done: 3 steps" in full and "elapsed" in full and "\r" not in full  # plain lines in a log
    saved = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "full" / "ckpt_0" / "*.ckpt")))
    assert saved == ["resnet18-1_2.ckpt", "resnet18-2_1.ckpt", "resnet18-2_3.ckpt", "resnet18-3_2.ckpt",
                     "resnet18-3_3.ckpt"]
    resumed = _train(THOR_CIFAR, data["cifar"], tmp_path / "resumed", *extra, "--resume",
                     str(tmp_path / "full" / "ckpt_0" / "resnet18-2_1.ckpt"), cwd=tmp_path)
    assert "resuming at global step 4" in resumed and "(global 4)" not in resumed and "(global 5)" in resumed
    pattern = r"\(global (\d+)\) loss ([0-9.]+) lr ([0-9.]+)"
    assert re.findall(pattern, resumed) == re.findall(pattern, full)[4:]  # same losses and lr, step for step
    final_full = _ckpt(tmp_path / "full" / "ckpt_0" / "resnet18-3_3.ckpt")
    _assert_same_state(final_full, _ckpt(tmp_path / "resumed" / "ckpt_0" / "resnet18-3_3.ckpt"))
    assert any("matrix_a_cov" in k for k in final_full) and int(final_full["global_step"].reshape(-1)[0]) == 9
    _, _, images = _eval(THOR_CIFAR, data["cifar"], tmp_path / "full" / "ckpt_0" / "resnet18-3_3.ckpt", tmp_path,
                         "--eval_steps=3")
    assert images == 12


@pytest.mark.slow
def test_momentum_imagefolder_resume_is_exact_and_eval(tmp_path, data):
    config = os.path.join(CONFIGS, "resnet50_imagenet2012_momentum.yaml")
    extra = ["--net=resnet18", "--epoch_size=2", "--steps_per_epoch=3", "--save_checkpoint_steps=2",
             "--warmup_epochs=1"]
    _train(config, data["images"], tmp_path / "full", *extra, cwd=tmp_path)
    _train(config, data["images"], tmp_path / "resumed", *extra, "--resume",
           str(tmp_path / "full" / "ckpt_0" / "resnet18-1_2.ckpt"), cwd=tmp_path)
    final = _ckpt(tmp_path / "full" / "ckpt_0" / "resnet18-2_3.ckpt")
    _assert_same_state(final, _ckpt(tmp_path / "resumed" / "ckpt_0" / "resnet18-2_3.ckpt"))
    assert any(k.startswith("moments.") for k in final)
    _, _, images = _eval(config, data["images_val"], tmp_path / "full" / "ckpt_0" / "resnet18-2_3.ckpt", tmp_path,
                         "--net=resnet18")
    assert images == 10


@pytest.mark.slow
def test_launch_scripts_thor_imagefolder_and_momentum_cifar(tmp_path, data):
    """run_standalone_train.sh + run_eval.sh: THOR on an ImageFolder tree and Momentum on CIFAR-10."""
    env = {"DEVICE_TARGET": "CPU"}
    for name, config, train_data, eval_data, extra, eval_images in [
            ("thor", os.path.join(CONFIGS, "resnet50_imagenet2012_thor_ascend.yaml"), data["images"],
             data["images_val"], ["--net=resnet18", "--lr_end_epoch=45", *THOR_ARGS], 10),
            ("mom", MOM_CIFAR, data["cifar"], data["cifar"], ["--eval_steps=2"], 8)]:
        run_dir = tmp_path / name
        train_extra = [e for e in extra if not e.startswith("--eval_steps")]
        out = _run(["bash", os.path.join(SCRIPTS, "run_standalone_train.sh"), train_data, config, "0", "--",
                    *TINY, "--epoch_size=1", "--steps_per_epoch=3", *train_extra], tmp_path,
                   env=dict(env, RUN_DIR=str(run_dir)))
        assert "exit status 0" in out
        log = (run_dir / "train.log").read_text()
        assert "epoch 1/1 done: 3 steps" in log and "checkpoint saved" in log
        (ckpt,) = glob.glob(str(run_dir / "output" / "ckpt_0" / "resnet18-1_3.ckpt"))
        eval_dir = tmp_path / f"{name}_eval"
        eval_extra = [e for e in extra if not e.startswith(("--frequency", "--split", "--lr_end"))]
        _run(["bash", os.path.join(SCRIPTS, "run_eval.sh"), eval_data, ckpt, config, "--", *TINY, *eval_extra],
             tmp_path, env=dict(env, RUN_DIR=str(eval_dir)))
        result = json.loads((eval_dir / "result.json").read_text())
        assert 0.0 <= result["top1"] <= result["top5"] <= 1.0 and result["images"] == eval_images
        assert "top1" in (eval_dir / "eval.log").read_text()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("extra", [[], ["--distribute_inverses=true", "--inverse=full", "--trace_omega_1=10",
                                          "--trace_omega_2=0.95"]], ids=["fixed", "shared_trace"])
def test_cpu_msrun_two_workers_thor(tmp_path, data, extra):
    """run_distribute_train_cpu.sh 2: ResNet-18 THOR, 2 msrun workers on 127.0.0.1, a few steps; also with
    the config keys of "Beyond MindSpore's THOR" (inversions shared across the ranks, the trace rule)."""
    if shutil.which("msrun") is None:
        pytest.fail("msrun (installed with MindSpore) is not on PATH")
    run_dir = tmp_path / "run"
    _run(["bash", os.path.join(SCRIPTS, "run_distribute_train_cpu.sh"), "2", data["cifar"], THOR_CIFAR, "--",
          *TINY, *THOR_ARGS, "--epoch_size=1", "--steps_per_epoch=3", *extra], tmp_path,
         env={"RUN_DIR": str(run_dir), **({"MS_COMPILER_CACHE_ENABLE": "0"} if extra else {})}, timeout=400)
    logs = sorted(os.path.basename(p) for p in glob.glob(str(run_dir / "log" / "worker_*.log")))
    assert logs == ["worker_0.log", "worker_1.log"]
    for rank in (0, 1):
        text = (run_dir / "log" / f"worker_{rank}.log").read_text()
        assert f"[rank {rank}/2]" in text and "epoch 1/1 done: 3 steps" in text
    rank0 = _ckpt(run_dir / "output" / "ckpt_0" / "resnet18-1_3.ckpt")
    rank1 = _ckpt(run_dir / "output" / "ckpt_1" / "resnet18-1_3.ckpt")
    if extra:  # one THOR step (step 0 of 3 at frequency 3): every layer inverted once, by exactly one rank
        counts = np.stack([rank0.pop("inversion_count"), rank1.pop("inversion_count")])
        np.testing.assert_array_equal(counts.sum(axis=0), np.ones(21))
        assert counts[0].sum() > 0 and counts[1].sum() > 0, counts
        assert [int(rank0[f"thor_inversions_{i}"]) for i in range(21)] == [1] * 21  # the trace rule's count
    _assert_same_state(rank0, rank1)
    assert int(rank0["global_step"].reshape(-1)[0]) == 3


def _run_failing(cmd, cwd):
    """Without the shared compile cache, whose own warnings would add stderr lines."""
    proc = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_diverging_run_stops_and_every_checkpoint_left_is_finite(tmp_path, data):
    """Momentum at lr_max 1e5, a checkpoint every step, only one kept: the run stops at the first
    non-finite loss or state with one line on stderr and exit status 1, and the one checkpoint left
    (the last finite one, which rotation must not delete) holds only finite values."""
    out = tmp_path / "out"
    proc, lines = _run_failing([sys.executable, TRAIN, "--config_path", MOM_CIFAR, "--data_path", data["cifar"],
                                "--output_dir", str(out), "--device_target", "CPU", *TINY, "--epoch_size=3",
                                "--steps_per_epoch=4", "--lr_max=100000", "--save_checkpoint_steps=1",
                                "--keep_checkpoint_max=1"], tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: step "), proc.stderr
    assert "non-finite" in lines[0] or "loss became" in lines[0]
    saved = glob.glob(str(out / "ckpt_0" / "*.ckpt"))
    assert len(saved) == 1 and f"last finite checkpoint {saved[0]}" in lines[0], (saved, lines)
    for key, value in _ckpt(saved[0]).items():
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.isfinite(value)), key


@pytest.mark.slow
def test_corrupt_image_mid_training_names_the_file_exit_2(tmp_path):
    """An ImageFolder image that cannot be decoded, met while training: exit status 2, no traceback,
    and the last stderr line is the trainer's one-line error naming the file (MindSpore's data
    pipeline logs its own ERROR line before it)."""
    images = write_image_folder(str(tmp_path / "images"), per_class=4, classes=2, size=24)
    bad = os.path.join(images, "n00000001", "img_0002.png")
    with open(bad, "wb") as handle:
        handle.write(b"\x89PNG\r\n\x1a\n" + b"not an image" * 8)
    config = os.path.join(CONFIGS, "resnet50_imagenet2012_momentum.yaml")
    proc, lines = _run_failing([sys.executable, TRAIN, "--config_path", config, "--data_path", images,
                                "--output_dir", str(tmp_path / "out"), "--device_target", "CPU", *TINY,
                                "--net=resnet18", "--epoch_size=2"], tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lines[-1].startswith("train.py: error: cannot decode image ") and bad in lines[-1], proc.stderr
