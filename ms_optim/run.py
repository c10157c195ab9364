"""Run an unmodified MindSpore script with ms_optim's THOR, Lamb, LARS and ASGD in place of MindSpore's.

Usage::

    python -m ms_optim.run [--thor adaptive] SCRIPT.py [SCRIPT ARGS...]
    python -m ms_optim.run [--thor adaptive] -m PACKAGE.MODULE [MODULE ARGS...]

The script runs exactly as ``python SCRIPT.py ARGS...`` would run it (``__name__ == "__main__"``,
``sys.argv[0]`` the script path and the rest its own arguments, the script's folder first on
``sys.path``, its exit status returned), except that ``ms_optim.use()`` is active: the MindSpore names
``mindspore.nn.{thor, Lamb, LARS, ASGD, DenseThor, Conv2dThor, EmbeddingThor,
TrainOneStepWithLossScaleCell}``,
``mindspore.amp.build_train_network``,
``mindspore.ConvertModelUtils``, ``mindspore.train.ConvertModelUtils`` and
``mindspore.train.train_thor.*`` point at ms_optim's implementations. One line on stderr says what was
replaced. ``--thor adaptive`` is ``ms_optim.use(thor="adaptive")``: every ``thor()`` call of the script
builds recipe-free THOR (``learning_rate`` and ``damping`` ``"adaptive"``, the other arguments as given).
"""
from __future__ import annotations

import importlib.util
import os
import pkgutil
import runpy
import sys
from typing import List, Optional, Sequence, Tuple

from ms_optim._thor_option import THOR_MODES

__all__ = ["main"]

USAGE = """\
usage: python -m ms_optim.run [-h] [--thor adaptive] SCRIPT [ARGS ...]
       python -m ms_optim.run [-h] [--thor adaptive] -m MODULE [ARGS ...]

Run a MindSpore training script unmodified, with MindSpore's THOR, Lamb, LARS, ASGD and
loss-scaled training step (mindspore.nn.{thor, Lamb, LARS, ASGD, DenseThor, Conv2dThor,
EmbeddingThor, TrainOneStepWithLossScaleCell}, mindspore.amp.build_train_network,
mindspore.ConvertModelUtils, mindspore.train.ConvertModelUtils, mindspore.train.train_thor.*)
replaced by ms_optim's, which also run on CPU.

positional arguments:
  SCRIPT       path of the Python script to run as __main__
  ARGS         passed to the script unchanged (sys.argv[1:]), including options like --help

options:
  -h, --help   show this message and exit (only when given before SCRIPT)
  -m MODULE    run a module as `python -m MODULE` would, instead of a script file
  --thor adaptive
               recipe-free THOR: every thor(...) call (MindSpore's or ms_optim's) is made
               with learning_rate="adaptive" and damping="adaptive" in place of the
               script's schedules, every other argument as given (momentum below 1,
               use_nesterov False); one stderr line per call says what was replaced, one
               line at exit if the script made no thor() call. The script must step the
               optimizer with ConvertModelUtils' THOR model or ms_optim's training cells.

Options go before SCRIPT. The exit status is the script's; a bad option, or a SCRIPT or MODULE
that cannot be found, is one line on stderr and exit status 2, before the script runs (a SCRIPT
folder or zip without __main__.py: exit status 1, as `python DIR`). In your own code,
`ms_optim.use()` does the same (`with ms_optim.use(): ...`, `ms_optim.use(thor="adaptive")`, or
`ms_optim.undo_use()` to restore MindSpore's names).
"""

#: how messages name the option (its one accepted value so far)
THOR_OPTION = "python -m ms_optim.run --thor {}"


def _usage_error(message: str) -> SystemExit:
    """A usage error: one line on stderr (with a pointer to --help), exit status 2 (as argparse)."""
    sys.stderr.write(f"ms_optim.run: error: {message}; python -m ms_optim.run --help shows the usage\n")
    return SystemExit(2)


def _thor_value(value: str) -> str:
    if value not in THOR_MODES:
        choices = ", ".join(repr(mode) for mode in THOR_MODES)
        raise _usage_error(f"argument --thor: invalid choice: {value!r} (choose from {choices})")
    return value


def _options(argv: List[str]) -> Tuple[Optional[str], List[str]]:
    """ms_optim.run's own options before the target: (--thor value or None, the rest of argv)."""
    thor = None
    while argv and argv[0].startswith("--thor"):
        option = argv.pop(0)
        if option == "--thor":
            if not argv:
                raise _usage_error("argument --thor: expected one argument (choose from "
                                   + ", ".join(repr(mode) for mode in THOR_MODES) + ")")
            thor = _thor_value(argv.pop(0))
        elif option.startswith("--thor="):
            thor = _thor_value(option[len("--thor="):])
        else:
            argv.insert(0, option)
            break
    return thor, argv


def _parse(argv: Sequence[str]):
    """Split ms_optim.run's own options from the target and its arguments: (kind, target, args, thor).
    A usage error raises SystemExit(2) after one line on stderr."""
    if list(argv[:1]) in (["-h"], ["--help"]):
        return "help", None, [], None
    thor, argv = _options(list(argv))
    if not argv and thor is not None:
        raise _usage_error("expected SCRIPT or -m MODULE after the options")
    if not argv or argv[0] in ("-h", "--help"):
        return "help", None, [], thor
    if argv[0] == "-m":
        if len(argv) < 2:
            raise _usage_error("argument -m: expected a module name")
        return "module", argv[1], argv[2:], thor
    if argv[0].startswith("-m") and len(argv[0]) > 2:
        return "module", argv[0][2:], argv[1:], thor
    if argv[0].startswith("-") and argv[0] != "-":
        raise _usage_error(f"unknown option {argv[0]!r} (options go before SCRIPT)")
    return "script", argv[0], argv[1:], thor


def _set_path0(folder: str, package_root: str) -> None:
    """Make ``folder`` sys.path[0], as Python does for the script it runs."""
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    if not any(os.path.abspath(p or os.curdir) == package_root for p in sys.path):
        sys.path.append(package_root)


def _module_problem(name: str) -> Optional[str]:
    """Why ``python -m NAME`` cannot start (no such module, or a package without ``__main__``), or None.
    Finding a submodule imports its parent packages, as running it would."""
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            if importlib.util.find_spec(f"{name}.__main__") is None:
                return f"{name!r} is a package and cannot be directly executed (no {name}.__main__)"
    except (ImportError, ValueError) as exc:  # a missing parent package, or an empty/relative name
        return str(exc).splitlines()[0] if str(exc) else f"No module named {name!r}"
    return None if spec is not None else f"No module named {name!r}"


def _top_level_problem(name: str) -> Optional[str]:
    """``_module_problem`` for the first component of ``name`` only, which imports nothing, with the
    current directory first on ``sys.path`` as ``python -m`` has it."""
    top = name.split(".")[0]
    if not top:
        return f"No module named {name!r}"
    saved = sys.path[:]
    try:
        sys.path[:1] = [os.getcwd()]
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path[:] = saved
    return None if found else f"No module named {top!r}"


def _lacks_main(target: str) -> bool:
    """``target`` is a folder or zip archive (what Python runs through its ``__main__``) without one."""
    importer = pkgutil.get_importer(os.path.abspath(target))
    return importer is not None and importer.find_spec("__main__") is None


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m ms_optim.run``; returns the process exit status."""
    kind, target, args, thor = _parse(sys.argv[1:] if argv is None else argv)
    if kind == "help":
        sys.stdout.write(USAGE)
        return 0
    if kind == "script" and not os.path.exists(target):
        sys.stderr.write(f"ms_optim.run: error: can't open file {target!r}: no such file\n")
        return 2
    if kind == "script" and _lacks_main(target):  # before use(): its notice would be a second line
        sys.stderr.write(f"ms_optim.run: error: can't find '__main__' module in {target!r}\n")
        return 1  # as `python DIR`

    if kind == "module":
        problem = _top_level_problem(target)
        if problem is not None:  # before use(): its notice would be a second line
            sys.stderr.write(f"ms_optim.run: error: -m {target}: {problem}\n")
            return 2

    import ms_optim
    from ms_optim._patch import activate

    patch = activate(thor=thor, option=THOR_OPTION.format(thor))
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    # ms_optim imports some of its modules lazily: if it was found only through the folder that is
    # about to give way to the script's, keep that folder reachable (last, so the script's win).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(ms_optim.__file__)))
    try:
        if kind == "script":
            sys.argv = [target] + list(args)
            # As `python SCRIPT`: the script's own folder is first on sys.path (not ours).
            script_dir = os.path.dirname(os.path.abspath(target))
            _set_path0(script_dir, package_root)
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = [target] + list(args)  # runpy replaces argv[0] by the module's file
            _set_path0(os.getcwd(), package_root)
            problem = _module_problem(target)
            if problem is not None:
                sys.stderr.write(f"ms_optim.run: error: -m {target}: {problem}\n")
                return 2
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        sys.stderr.write(f"{code}\n")
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        patch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
