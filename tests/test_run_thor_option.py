"""``python -m ms_optim.run --thor adaptive`` and ``ms_optim.use(thor="adaptive")``: every thor() call of an
unmodified script builds recipe-free THOR.

* a bad value of the option is refused before the script runs (exit status 2, one stderr line);
* under the option thor() (MindSpore's names and ms_optim's) is made with learning_rate and damping
  "adaptive" and every other argument as given: the optimizer's config equals that of the explicit
  adaptive call; one stderr line per call says what was replaced;
* a call adaptive THOR cannot serve (use_nesterov=True, momentum 1.0) fails naming the option;
* an activation without any thor() call says at its end (or at process exit) that the option had no
  effect;
* use(thor=...) is validated, and nesting cannot change the mode;
* a ModelThor built from the option trains (MindSpore-only script, subprocess).
"""
import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap

import mindspore.nn as ms_nn
import numpy as np
import pytest
from mindspore import Tensor

import ms_optim
from ms_optim import _patch, run
from ms_optim._thor.factory import thor as plain_thor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "scripts", "thor_mindspore_script.py")
RUN_OPTION = "python -m ms_optim.run --thor adaptive"
USE_OPTION = "ms_optim.use(thor='adaptive')"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOG_v"] = "3"
    return env


def _net():
    return ms_nn.SequentialCell([ms_nn.Dense(4, 3), ms_nn.ReLU(), ms_nn.Dense(3, 2)])


def _schedule(value, steps=6):
    return Tensor(np.full(steps, value, np.float32))


def _script(tmp_path, body):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _lines(err, prefix):
    return [line for line in err.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("argv, message", [
    (["--thor", "bogus"], "argument --thor: invalid choice: 'bogus' (choose from 'adaptive')"),
    (["--thor=Adaptive"], "argument --thor: invalid choice: 'Adaptive' (choose from 'adaptive')"),
    (["--thor="], "argument --thor: invalid choice: '' (choose from 'adaptive')"),
    (["--thor"], "argument --thor: expected one argument"),
    (["--thorough"], "unknown option '--thorough' (options go before SCRIPT)")])
def test_bad_option_is_refused_before_the_script_runs(tmp_path, capsys, argv, message):
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(SystemExit) as info:
        run.main([*argv, script] if argv != ["--thor"] else argv)
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ms_optim.run: error: {message}"), lines
    assert "--help" in lines[0]
    assert not marker.exists() and not _patch.is_active()


def test_bad_option_exit_status_2_from_the_command_line(tmp_path):
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", "--thor", "schedule", script], capture_output=True,
                          text=True, env=_env(), cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["ms_optim.run: error: argument --thor: invalid choice: 'schedule' (choose "
                                        "from 'adaptive'); python -m ms_optim.run --help shows the usage"]
    assert not marker.exists()
    help_text = subprocess.run([sys.executable, "-m", "ms_optim.run", "--help"], capture_output=True, text=True,
                               env=_env(), timeout=120).stdout
    assert "[--thor adaptive] SCRIPT" in help_text and 'learning_rate="adaptive" and damping="adaptive"' in help_text


def test_script_without_thor_is_told_at_exit(tmp_path, capsys):
    script = _script(tmp_path, """
        import sys
        import mindspore.nn as nn
        net = nn.Dense(2, 2)
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        print("SCRIPT", type(opt).__name__)
        sys.exit(4)
    """)
    assert run.main(["--thor", "adaptive", script]) == 4
    captured = capsys.readouterr()
    assert "SCRIPT Momentum" in captured.out
    assert captured.err.splitlines()[-1] == f"{RUN_OPTION}: no thor() call was made, so the option had no effect."
    assert not _patch.is_active()
    assert run.main([script]) == 4  # without the option: no such line
    assert "no effect" not in capsys.readouterr().err


def test_option_before_a_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "probe_module.py").write_text("import mindspore.nn as nn\nprint('MODULE', nn.thor.__name__)\n")
    monkeypatch.chdir(tmp_path)
    assert run.main(["--thor", "adaptive", "-m", "probe_module"]) == 0
    captured = capsys.readouterr()
    assert "MODULE thor" in captured.out
    assert captured.err.splitlines()[-1] == f"{RUN_OPTION}: no thor() call was made, so the option had no effect."
    assert not _patch.is_active()


def test_run_makes_the_scripts_thor_calls_recipe_free(tmp_path, capsys):
    """MindSpore's name and ms_optim's, in one script: both calls adaptive, one line each, no exit notice."""
    script = _script(tmp_path, """
        import numpy as np
        import mindspore.nn as nn
        from mindspore import Tensor
        from ms_optim import nn as ms_optim_nn
        lr, damping = Tensor(np.full(5, 0.1, np.float32)), Tensor(np.float32(0.03))
        a = nn.thor(nn.SequentialCell([nn.Dense(4, 3)]), lr, damping, 0.8, frequency=4)
        b = ms_optim_nn.thor(nn.SequentialCell([nn.Dense(4, 3)]), lr, damping, 0.7)
        print("SCRIPT", [(o.config.lr_mode, o.config.damping_mode, o.config.momentum) for o in (a, b)])
    """)
    assert run.main(["--thor=adaptive", script]) == 0
    captured = capsys.readouterr()
    assert "SCRIPT [('adaptive', 'adaptive', 0.8), ('adaptive', 'adaptive', 0.7)]" in captured.out
    calls = _lines(captured.err, f"{RUN_OPTION}: ")
    assert calls == [f"{RUN_OPTION}: thor() builds recipe-free THOR: learning_rate Tensor of shape (5,) and damping "
                     f"Tensor of shape () replaced by 'adaptive' (not read); momentum={m} and the other arguments as "
                     f"given." for m in (0.8, 0.7)], captured.err
    assert ms_nn.thor.__module__ == "mindspore.nn.optim.thor" and ms_optim.thor is plain_thor


def test_every_other_argument_is_kept(capsys):
    """The config under the option equals the explicit adaptive call's, argument for argument."""
    def decay(param):
        return "bias" not in param.name

    args = (0.85, 1e-4, 64.0, 16, False, decay, [0], True, 7)
    keywords = dict(inverse="full", block_size=64, kl_clip=1e-3, factor_convention="gpu", trace_thresholds=(0.5, 0.1),
                    adapt_every=3, damping_bounds=(1e-6, 10.0))
    with ms_optim.use(thor="adaptive"):
        import mindspore.nn as nn

        assert nn.thor is ms_optim.thor is ms_optim.nn.thor and nn.thor is not plain_thor
        assert inspect.signature(nn.thor) == inspect.signature(plain_thor) and nn.thor.__doc__ == plain_thor.__doc__
        net = _net()
        opt = nn.thor(net, _schedule(0.1), _schedule(0.01), *args, **keywords)
    expected = plain_thor(_net(), "adaptive", "adaptive", *args, **keywords).config
    for field in dataclasses.fields(expected):
        assert getattr(opt.config, field.name) == getattr(expected, field.name), field.name
    assert (opt.config.lr_mode, opt.config.damping_mode, opt.config.momentum) == ("adaptive", "adaptive", 0.85)
    assert opt.config.decay_filter is decay and opt.config.frequency == 7 and opt.config.enable_clip_grad
    assert type(net[0]).__name__ == "DenseThor"
    err = capsys.readouterr().err
    assert _lines(err, f"{USE_OPTION}: thor() builds recipe-free THOR: learning_rate Tensor of shape (6,) and "
                       f"damping Tensor of shape (6,) replaced by 'adaptive' (not read); momentum=0.85")
    assert "no effect" not in err
    assert ms_nn.thor.__module__ == "mindspore.nn.optim.thor"
    assert "thor" not in vars(ms_optim) and "thor" not in vars(ms_optim.nn)  # the lazy facades again


@pytest.mark.parametrize("overrides, words", [
    (dict(use_nesterov=True), ["use_nesterov=False", "use_nesterov=True"]),
    (dict(momentum=1.0), ["'momentum' less than 1.0", "momentum=1.0"]),
    (dict(momentum=1.5), ["momentum=1.5"])])
def test_a_call_adaptive_thor_cannot_serve_names_the_option(tmp_path, overrides, words):
    call = dict(dict(learning_rate=_schedule(0.1), damping=_schedule(0.01), momentum=0.9), **overrides)
    with ms_optim.use(thor="adaptive", verbose=False):
        import mindspore.nn as nn

        net = _net()
        with pytest.raises(ValueError) as info:
            nn.thor(net, **call)
    message = str(info.value)
    assert message.startswith("For 'thor', ms_optim.use(thor='adaptive') replaces learning_rate"), message
    assert all(word in message for word in words), message
    assert type(net[0]) is ms_nn.Dense  # refused before the net was converted
    plain_thor(_net(), **call)  # the same call without the option trains with its schedules

    script = _script(tmp_path, f"""
        import numpy as np
        import mindspore.nn as nn
        from mindspore import Tensor
        s = Tensor(np.full(4, 0.1, np.float32))
        nn.thor(nn.SequentialCell([nn.Dense(4, 3)]), s, s, **{dict(momentum=0.9) | overrides!r})
    """)
    with pytest.raises(ValueError, match=r"python -m ms_optim\.run --thor adaptive replaces learning_rate"):
        run.main(["--thor", "adaptive", script])
    assert not _patch.is_active()


def test_other_refusals_of_adaptive_thor_name_the_option_too():
    """A ValueError of thor() about adaptive THOR (one the wrapper does not check first) gets the option's
    name appended; any other error passes through unchanged."""
    from ms_optim._thor_option import adaptive_thor

    def fake(net, learning_rate, damping, momentum, adapt_every=None):
        if adapt_every == 0:
            raise ValueError(f"damping={damping!r} needs adapt_every >= 1")
        raise ValueError("momentum is not in the range")

    wrapped = adaptive_thor(fake, "OPTION", report=lambda line: None)
    with pytest.raises(ValueError) as info:
        wrapped(None, 0.1, 0.01, 0.5, adapt_every=0)
    assert str(info.value) == ("damping='adaptive' needs adapt_every >= 1 (OPTION replaced learning_rate and "
                               "damping by 'adaptive'.)")
    with pytest.raises(ValueError) as info:
        wrapped(None, 0.1, 0.01, 0.5)
    assert str(info.value) == "momentum is not in the range"
    with pytest.raises(TypeError):
        wrapped(None, 0.1)  # as the call itself: momentum missing
    assert wrapped.calls == 3


@pytest.mark.parametrize("value, error, shows", [
    (1, TypeError, "int 1"), (True, TypeError, "bool True"), (b"adaptive", TypeError, "bytes b'adaptive'"),
    ("Adaptive", ValueError, "'Adaptive'"), ("schedule", ValueError, "'schedule'"), ("", ValueError, "''")])
def test_use_thor_is_validated(value, error, shows):
    with pytest.raises(error) as info:
        ms_optim.use(thor=value)
    message = str(info.value)
    assert message.startswith("For 'use', the argument 'thor' must be None or") and shows in message, message
    assert "'adaptive'" in message and not _patch.is_active()
    with pytest.raises(TypeError):
        ms_optim.use(False, "adaptive")  # keyword-only


def test_nesting_joins_the_active_mode_and_cannot_change_it(capsys):
    with ms_optim.use(thor="adaptive") as outer:
        wrapper = ms_nn.thor
        with ms_optim.use(verbose=False):  # thor=None joins whatever is active
            assert ms_nn.thor is wrapper
        with ms_optim.use(thor="adaptive", verbose=False):
            assert ms_nn.thor is wrapper
        assert _patch.is_active() and ms_nn.thor is wrapper and isinstance(outer, _patch.UsePatch)
    err = capsys.readouterr().err
    assert len(_lines(err, "ms_optim.use():")) == 1
    assert _lines(err, f"{USE_OPTION}: ") == [f"{USE_OPTION}: no thor() call was made, so the option had no effect."]

    with ms_optim.use(verbose=False):
        with pytest.raises(ValueError, match=r"'thor' must be None or the active activation's \(None\) in a nested "
                                             r"call, but got 'adaptive'"):
            ms_optim.use(thor="adaptive")
        assert ms_nn.thor is plain_thor  # unchanged, and not one level deeper:
    assert not _patch.is_active() and ms_nn.thor.__module__ == "mindspore.nn.optim.thor"
    assert ms_optim.undo_use() is False

    patch = ms_optim.use(thor="adaptive", verbose=False)
    assert ms_optim.undo_use() is True  # ends it at once (silently with verbose=False)
    patch.undo()
    assert not _patch.is_active() and "no effect" not in capsys.readouterr().err


def test_process_exit_without_undo_says_the_option_had_no_effect():
    code = "import ms_optim\nms_optim.use(thor='adaptive')\nprint('END')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "END", proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == f"{USE_OPTION}: no thor() call was made, so the option had no effect."


def test_modelthor_built_under_the_option_trains():
    """The MindSpore-only script (nn.thor with schedules, ConvertModelUtils, O2, loss-scale manager, sink)."""
    proc = subprocess.run([sys.executable, "-m", "ms_optim.run", "--thor", "adaptive", SCRIPT, "--steps", "4",
                           "--frequency", "2"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert _lines(proc.stderr, f"{RUN_OPTION}: thor() builds recipe-free THOR: learning_rate Tensor of shape (4,) "
                               f"and damping Tensor of shape (4,) replaced by 'adaptive'"), proc.stderr[-4000:]
    assert "no effect" not in proc.stderr
    assert "model=ms_optim._thor.model.ModelThor" in proc.stdout
    assert "script: changed=True finite=True" in proc.stdout, output[-4000:]
