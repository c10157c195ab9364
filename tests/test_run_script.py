"""ms_optim.use() / undo_use() and ``python -m ms_optim.run SCRIPT``: unmodified MindSpore scripts.

* use() replaces MindSpore's names everywhere a script can reach them (``import mindspore.nn as nn``,
  ``from mindspore.nn import ...``, ``mindspore.ConvertModelUtils``, ``mindspore.train.train_thor``
  and its submodules, including one imported only after use()), prints one line, and undo puts back
  exactly what was there (a snapshot of every ``mindspore.*`` module's attributes compares equal).
* ``python -m ms_optim.run tests/scripts/thor_mindspore_script.py`` trains a script that mentions only
  ``mindspore.nn.thor``/``mindspore.ConvertModelUtils`` on CPU, in a subprocess.
"""
import os
import subprocess
import sys
import textwrap

import mindspore as ms
import mindspore.nn as ms_nn
import pytest

import ms_optim
from ms_optim import _patch, run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "scripts", "thor_mindspore_script.py")
NAMES = ("thor", "Lamb", "LARS", "ASGD", "DenseThor", "Conv2dThor", "EmbeddingThor", "ConvertModelUtils",
         "ConvertNetUtils", "ModelThor", "TrainOneStepWithLossScaleCell", "build_train_network")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOG_v"] = "3"  # MindSpore's own warnings off, so the one use() line is easy to find
    return env


def _snapshot():
    """(module, name) -> object for every replaced name in every loaded mindspore.* module."""
    out = {}
    for modname, module in list(sys.modules.items()):
        if (modname == "mindspore" or modname.startswith("mindspore.")) and hasattr(module, "__dict__"):
            for name in NAMES:
                if name in module.__dict__:
                    out[(modname, name)] = module.__dict__[name]
    return out


def _ours(name):
    return getattr(ms_optim, name)


def test_use_replaces_every_public_path_and_undo_restores_exactly(capsys):
    before = _snapshot()
    originals = {name: getattr(ms_nn, name) for name in ("thor", "Lamb", "LARS", "ASGD", "DenseThor")}
    with ms_optim.use() as patch:
        assert _patch.is_active()
        for name in ("thor", "Lamb", "LARS", "ASGD", "DenseThor", "Conv2dThor", "EmbeddingThor"):
            assert getattr(ms_nn, name) is _ours(name), name
        import mindspore.train.train_thor.convert_utils as convert_utils
        import mindspore.train.train_thor.model_thor as model_thor
        from mindspore.nn import Lamb, thor  # noqa: F401  (the `from` form reads the patched module)
        from mindspore.nn.optim import LARS
        from mindspore.train.train_thor import ConvertModelUtils, ConvertNetUtils, ModelThor

        assert (thor, Lamb, LARS) == (_ours("thor"), _ours("Lamb"), _ours("LARS"))
        assert (ConvertModelUtils, ConvertNetUtils, ModelThor) == tuple(
            _ours(n) for n in ("ConvertModelUtils", "ConvertNetUtils", "ModelThor"))
        assert ms.ConvertModelUtils is ms.train.ConvertModelUtils is _ours("ConvertModelUtils")
        assert ms.ConvertNetUtils is _ours("ConvertNetUtils")
        assert convert_utils.ConvertModelUtils is _ours("ConvertModelUtils")
        assert model_thor.ModelThor is _ours("ModelThor")
        with ms_optim.use(verbose=False):  # nested: the inner exit keeps the outer activation
            pass
        assert ms_nn.thor is _ours("thor")
        assert isinstance(patch, _patch.UsePatch)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ms_optim.use():")]
    assert len(lines) == 1, err
    assert ("mindspore.nn.{thor, Lamb, LARS, ASGD, DenseThor, Conv2dThor, EmbeddingThor, "
            "TrainOneStepWithLossScaleCell}") in lines[0]
    assert "mindspore.amp.{build_train_network}" in lines[0]
    assert "mindspore.train.train_thor.{ConvertModelUtils, ConvertNetUtils, ModelThor}" in lines[0]

    assert not _patch.is_active()
    assert {name: getattr(ms_nn, name) for name in originals} == originals
    assert not hasattr(sys.modules["mindspore.train.train_thor"], "ModelThor")
    after = _snapshot()
    # model_thor may have been imported during the test: its MindSpore class is back too.
    assert {k: v for k, v in after.items() if k in before} == before
    assert all(not getattr(v, "__module__", "").startswith("ms_optim") for v in after.values())


def test_use_function_form_and_undo_use():
    patch = ms_optim.use(verbose=False)
    ms_optim.use(verbose=False)  # a second activation
    assert ms_nn.Lamb is _ours("Lamb")
    patch.undo()
    assert ms_nn.Lamb is _ours("Lamb")  # the second activation still holds
    assert ms_optim.undo_use() is True  # ends every activation at once
    assert ms_nn.Lamb is not _ours("Lamb") and ms_nn.Lamb.__module__ == "mindspore.nn.optim.lamb"
    assert ms_optim.undo_use() is False
    with pytest.raises(TypeError, match="verbose"):
        ms_optim.use(verbose=1)
    assert not _patch.is_active()


def test_stale_handle_undo_does_not_end_a_newer_activation():
    old = ms_optim.use(verbose=False)
    assert ms_optim.undo_use() is True  # ends the activation `old` belongs to
    new = ms_optim.use(verbose=False)
    try:
        old.undo()  # stale: must not touch the newer activation
        assert _patch.is_active()
        assert ms_nn.Lamb is _ours("Lamb")
    finally:
        new.undo()
    assert not _patch.is_active()
    assert ms_nn.Lamb.__module__ == "mindspore.nn.optim.lamb"


def test_use_replaces_the_names_of_the_facade_tables(monkeypatch):
    """The replaced names come from ms_optim.nn / ms_optim.train_thor ``_EXPORTS``, not from a second list."""
    from ms_optim import nn as facade

    original_asgd = ms_nn.ASGD
    original_cell = ms_nn.TrainOneStepWithLossScaleCell
    monkeypatch.delitem(facade._EXPORTS, "ASGD")
    with ms_optim.use(verbose=False):
        assert ms_nn.Lamb is _ours("Lamb")
        assert ms_nn.ASGD is original_asgd  # no longer in the table: not replaced
        # a subclass of MindSpore's cell, replaced too (MindSpore's own fails on CPU)
        assert ms_nn.TrainOneStepWithLossScaleCell is _ours("TrainOneStepWithLossScaleCell")
    assert ms_nn.Lamb.__module__ == "mindspore.nn.optim.lamb"
    assert ms_nn.TrainOneStepWithLossScaleCell is original_cell


def test_use_reaches_modules_imported_later():
    """A mindspore.* module first imported under use() is patched, and restored by undo."""
    code = textwrap.dedent("""
        import sys, mindspore, ms_optim
        name = "mindspore.train.train_thor.model_thor"
        assert name not in sys.modules, "imported too early for this check"
        with ms_optim.use(verbose=False):
            from mindspore.train.train_thor.model_thor import ModelThor
            assert ModelThor is ms_optim.ModelThor
            assert sys.modules[name].__loader__.__class__.__name__ != "_PatchingLoader"
        from mindspore.train.train_thor.model_thor import ModelThor as Theirs
        assert Theirs is not ms_optim.ModelThor and Theirs.__module__ == name
        print("LATE-IMPORT-OK")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LATE-IMPORT-OK" in proc.stdout


def test_run_main_argv_name_exit_code_and_restore(tmp_path, capsys):
    """In-process: the script sees __main__, its own argv and folder; its exit status comes back."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import sys
        import mindspore.nn as nn
        print("PROBE", __name__, sys.argv, sys.path[0], nn.thor.__module__)
        raise SystemExit(int(sys.argv[2]))
    """))
    argv_before, path_before = sys.argv[:], sys.path[:]
    assert run.main([str(script), "--flag", "7"]) == 7
    out = capsys.readouterr().out
    assert f"PROBE __main__ ['{script}', '--flag', '7'] {tmp_path} ms_optim._thor.factory" in out
    assert sys.argv == argv_before and sys.path == path_before
    assert not _patch.is_active() and ms_nn.thor.__module__ == "mindspore.nn.optim.thor"

    assert run.main([str(tmp_path / "missing.py")]) == 2
    assert run.main(["--help"]) == 0
    assert "usage: python -m ms_optim.run" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run.main(["--bogus", str(script)])


def test_python_m_run_folder_without_main_is_one_line_as_python(tmp_path):
    """``python -m ms_optim.run DIR`` without DIR/__main__.py: Python's one line and exit status 1, no
    runpy traceback; with a __main__.py the folder runs as ``python DIR`` runs it."""
    folder = tmp_path / "app"
    folder.mkdir()
    plain = subprocess.run([sys.executable, str(folder)], capture_output=True, text=True, timeout=60)
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", str(folder)], capture_output=True, text=True,
                          env=_env(), cwd=str(tmp_path), timeout=300)
    assert (proc.returncode, plain.returncode) == (1, 1), proc.stderr
    assert proc.stderr.splitlines() == [f"ms_optim.run: error: can't find '__main__' module in '{folder}'"]
    assert plain.stderr.strip().endswith(f"can't find '__main__' module in '{folder}'")
    (folder / "__main__.py").write_text("import sys\nprint('MAIN', __name__)\nsys.exit(5)\n")
    assert run.main([str(folder)]) == 5
    assert not _patch.is_active()


@pytest.mark.parametrize("target, message", [
    ("missing_module", "No module named 'missing_module'"),
    ("missing_package.sub", "No module named 'missing_package'"),
    ("json", "'json' is a package and cannot be directly executed (no json.__main__)")])
def test_python_m_run_unknown_module_is_one_line_exit_2(tmp_path, target, message):
    """``python -m ms_optim.run -m MODULE`` with nothing to run: no runpy traceback, exit status 2 and one
    error line (for a missing top-level name even before use(), so it is the only stderr line)."""
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", "-m", target, "--x"], capture_output=True,
                          text=True, env=_env(), cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if target.startswith("missing"):
        assert lines == [f"ms_optim.run: error: -m {target}: {message}"]
    else:
        assert lines[-1] == f"ms_optim.run: error: -m {target}: {message}" and len(lines) == 2, lines
    path_before = sys.path[:]
    assert run.main(["-m", target]) == 2  # in-process too, leaving sys.path and MindSpore's names as they were
    assert sys.path == path_before and not _patch.is_active()


@pytest.mark.slow
def test_python_m_ms_optim_run_trains_a_mindspore_thor_script():
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", SCRIPT, "--steps", "4", "--frequency", "2",
                           "--exit-code", "3"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output[-4000:]
    replaced = [line for line in proc.stderr.splitlines() if line.startswith("ms_optim.use():")]
    assert len(replaced) == 1, proc.stderr[-4000:]
    assert "mindspore.nn.{thor" in replaced[0] and "mindspore.{build_train_network, ConvertModelUtils" in replaced[0]
    assert ("script: name=__main__ argv=['--steps', '4', '--frequency', '2', '--exit-code', '3'] "
            "optimizer=ms_optim.") in proc.stdout, output[-4000:]
    assert "model=ms_optim._thor.model.ModelThor" in proc.stdout
    assert "script: changed=True finite=True" in proc.stdout, output[-4000:]


def test_mindspore_first_order_names_train_on_cpu_under_use():
    """Under use(), a script's ``nn.Lamb``/``nn.LARS``/``nn.ASGD`` (MindSpore's Lamb and LARS have no CPU
    kernel) train on CPU through the names the script already uses."""
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = Tensor(rng.standard_normal((8, 2)).astype(np.float32))
    with ms_optim.use(verbose=False):
        import mindspore.nn as nn

        makers = {"Lamb": lambda p: nn.Lamb(p, learning_rate=0.01),
                  "LARS": lambda p: nn.LARS(nn.Momentum(p, 0.05, 0.9), epsilon=0.0, coefficient=0.001),
                  "ASGD": lambda p: nn.ASGD(p, learning_rate=0.05)}
        for name, make in makers.items():
            ms.set_seed(0)
            net = nn.Dense(4, 2)
            opt = make(net.trainable_params())
            assert type(opt).__module__.startswith("ms_optim."), name
            step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
            before = net.weight.asnumpy().copy()
            for _ in range(2):
                step(x, y)
            after = net.weight.asnumpy()
            assert np.all(np.isfinite(after)) and not np.array_equal(after, before), name
    assert ms_nn.Lamb.__module__ == "mindspore.nn.optim.lamb"
