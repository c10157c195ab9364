"""Small helpers shared by the benchmarks: interleaved timing with medians, JSON and PNG writers.

Interleaving (every candidate timed once per round, rounds repeated) spreads machine noise
(other processes, frequency changes) evenly over the candidates, so their *ratios* stay
meaningful on a busy machine; medians ignore the occasional slow call.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import os
import platform
import re
import statistics
import sys
import textwrap
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

__all__ = ["float_list", "sync", "set_thor_state", "interleaved_medians", "copy_floor", "machine_info", "write_json",
           "read_json", "bar_plot", "plotted_from", "source_stamp", "RESULTS_DIR"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def float_list(text: str) -> List[float]:
    """``"0.01,0.1"`` -> ``[0.01, 0.1]``: a comma-separated command-line list of numbers."""
    return [float(x) for x in text.split(",") if x.strip()]


def sync() -> None:
    """Wait for queued MindSpore device work. On CPU a graph call returns when it is done (measured:
    reading a state Parameter right after a 16M-parameter step takes 0.1 ms), and MindSpore's
    ``runtime.synchronize`` refuses CPU, so this is a no-op there."""
    try:
        import mindspore as ms  # local: the plotting/JSON helpers do not need MindSpore
        if ms.get_context("device_target") != "CPU":
            ms.runtime.synchronize()
    except (ImportError, AttributeError):  # pragma: no cover - older MindSpore
        pass


def set_thor_state(opt, step: int, flags: Optional[bool] = None) -> None:
    """Put a THOR optimizer (``ms_optim.nn.thor``) in the state of training step ``step`` before a timed
    call: its ``global_step`` and every layer's ``thor_flag`` (``flags``; default what ``step`` implies,
    ``step % frequency == 0``). Pairs that never occur in training time the THOR step's parts:
    ``(0, False)`` inverts the stored factors without collecting new ones, ``(1, True)`` collects without
    inverting.

    Both are written in place with new tensors (``ops.assign``). ``Parameter.set_data(t)`` may alias
    ``t``, and the step's own writes (``global_step += 1``, the next step's flags) then change ``t``
    itself: a "step 0" or "flags on" tensor shared between calls would silently turn every later
    THOR-step call into a non-THOR one.
    """
    import mindspore as ms
    import numpy as np

    ms.ops.assign(opt.global_step, ms.Tensor(np.array([step], np.int32)))
    value = step % opt.frequency == 0 if flags is None else bool(flags)
    for flag in opt.thor_flags:
        ms.ops.assign(flag, ms.Tensor(value))


def interleaved_medians(candidates: Mapping[str, Callable[[], Any]], repeats: int = 30, warmup: int = 3,
                        synchronize: Callable[[], None] = sync,
                        prepare: Optional[Mapping[str, Callable[[], Any]]] = None) -> Dict[str, Dict[str, float]]:
    """Time every callable ``repeats`` times, interleaved round by round, after ``warmup`` calls each.

    Each round runs the candidates in a rotated order (so none is always first after a pause).
    ``prepare[name]``, where given, runs before every call of ``candidates[name]``, outside the timed
    region (e.g. to reset state so each call does the same work).
    Returns, per name: ``median_ms``, ``p25_ms``, ``p75_ms``, ``min_ms`` and ``n``.
    """
    names = list(candidates)
    prepare = prepare or {}
    for name in names:
        for _ in range(warmup):
            prepare.get(name, lambda: None)()
            candidates[name]()
        synchronize()
    samples: Dict[str, list] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            prepare.get(name, lambda: None)()
            synchronize()
            start = time.perf_counter()
            candidates[name]()
            synchronize()
            samples[name].append((time.perf_counter() - start) * 1e3)
    out = {}
    for name, values in samples.items():
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        out[name] = {"median_ms": statistics.median(values), "p25_ms": quartiles[0], "p75_ms": quartiles[2],
                     "min_ms": min(values), "n": len(values)}
    return out


def copy_floor(n_values: int, threads: Optional[int] = None) -> Callable[[], None]:
    """A callable copying ``n_values`` float32 values with NumPy, split over ``threads`` threads
    (default: all CPUs; NumPy releases the GIL while copying), i.e. moving ``8 * n_values`` bytes.
    Timing it gives the memory-bandwidth floor of work that must read and write that much: a
    single-threaded copy does not saturate memory on every machine, multi-threaded kernels would
    then beat a "floor"."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    threads = max(1, threads or os.cpu_count() or 1)
    src = np.ones(n_values, np.float32)
    dst = np.zeros_like(src)
    bounds = np.linspace(0, n_values, threads + 1).astype(int)
    chunks = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    if threads == 1:
        return lambda: np.copyto(dst, src)
    pool = ThreadPoolExecutor(max_workers=threads)

    def run() -> None:
        for future in [pool.submit(np.copyto, d, s) for d, s in chunks]:
            future.result()

    return run


def machine_info() -> Dict[str, Any]:
    """Where and with what the numbers were measured."""
    info: Dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    try:
        info["load_average_1m"] = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on every OS
        pass
    for module in ("numpy", "mindspore"):
        try:
            info[module] = importlib.import_module(module).__version__
        except ImportError:  # pragma: no cover
            info[module] = None
    return info


def _this_run() -> Dict[str, str]:
    """The command line and UTC time of this process, as a JSON record states them."""
    return {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


#: a JSON array of numbers, booleans and nulls only (no nested array, object or string)
_SCALAR_ARRAY = re.compile(r"\[(?:\s*(?:-?[0-9][0-9.eE+-]*|-?NaN|-?Infinity|true|false|null)\s*,)*"
                           r"\s*(?:-?[0-9][0-9.eE+-]*|-?NaN|-?Infinity|true|false|null)\s*\]")


def dumps_record(record: Mapping[str, Any]) -> str:
    """``record`` as indented JSON with every array of scalars on one line (a curve of a thousand steps is one
    line, not a thousand)."""
    text = json.dumps(record, indent=2, sort_keys=False)
    return _SCALAR_ARRAY.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(0)[1:-1].split(",")) + "]",
                             text) + "\n"


def write_json(path: str, payload: Mapping[str, Any]) -> str:
    """Write ``payload`` plus the command line, time and machine info to ``path`` (dirs created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {**_this_run(), "machine": machine_info(), **payload}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(dumps_record(record))
    return path


def read_json(path: str) -> Dict[str, Any]:
    """A record :func:`write_json` wrote."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


#: the record a plot is being redrawn from (:func:`plotted_from`); None: the plot shows this process's run
_PLOTTED_FROM: List[Optional[Mapping[str, Any]]] = [None]


@contextlib.contextmanager
def plotted_from(record: Mapping[str, Any]) -> Iterator[None]:
    """While active, :func:`save_figure` stamps the date and command of ``record`` (a JSON record being
    redrawn) instead of this process's."""
    _PLOTTED_FROM.append(record)
    try:
        yield
    finally:
        _PLOTTED_FROM.pop()


def source_stamp(record: Optional[Mapping[str, Any]] = None, width: int = 150) -> str:
    """``"<date> <time>Z, <cores>-core <machine>, MindSpore <v>: <command>"`` of ``record`` (default: this run),
    absolute paths shortened to their last two parts, wrapped to ``width`` characters."""
    run = dict(record) if record is not None else {**_this_run(), "machine": machine_info()}
    machine = run.get("machine") or {}
    where = ", ".join(part for part in (
        f"{machine['cpu_count']}-core {machine.get('processor', '')}".strip() if machine.get("cpu_count") else "",
        f"MindSpore {machine['mindspore']}" if machine.get("mindspore") else "") if part)
    command = " ".join(os.path.join(*word.split("/")[-2:]) if word.startswith("/") and word.count("/") > 2 else word
                       for word in str(run.get("command", "")).split())
    when = str(run.get("utc", "")).replace("T", " ")
    return textwrap.fill(f"{when}, {where}: {command}" if where else f"{when}: {command}", width)


def save_figure(fig, path: str, tight: bool = True) -> str:
    """Write a matplotlib figure as the benchmarks' PNG (110 dpi; folders made as needed) and close it.

    The figure carries its source at its foot: the date and command of the run it shows (this process, or
    the record :func:`plotted_from` names). Saved to the tight bounding box, so no label is clipped."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    stamp = source_stamp(_PLOTTED_FROM[-1], width=max(60, int(fig.get_figwidth() * 15)))
    fig.text(0.005, -0.01, stamp, ha="left", va="top", fontsize=7, color="#555555", family="monospace")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)
    return path


def bar_plot(path: str, labels: Sequence[str], values: Sequence[float], ylabel: str, title: str,
             errors: Optional[Sequence[Sequence[float]]] = None, hlines: Iterable[tuple] = (),
             marks: Optional[Sequence[float]] = None, marks_label: str = "") -> str:
    """Save a bar chart (Agg backend, no display needed). ``errors`` = (lower, upper) offsets;
    ``hlines`` = (y, label) reference lines such as a baseline; ``marks`` = one value per bar drawn
    as a short line across it (e.g. each bar's own memory floor), named ``marks_label`` in a legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels)), 3.6))
    bars = ax.bar(range(len(labels)), values, yerr=errors, capsize=3, color="#4C72B0")
    for index, (bar, value) in enumerate(zip(bars, values)):
        top = value + (errors[1][index] if errors is not None else 0.0)
        ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, top),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if marks is not None:
        for index, (bar, mark) in enumerate(zip(bars, marks)):
            ax.plot([bar.get_x(), bar.get_x() + bar.get_width()], [mark, mark], color="#DD8452", linewidth=2.5,
                    label=marks_label if index == 0 else None)
        if marks_label:
            ax.legend(fontsize=8, loc="upper left")
    for y, label in hlines:
        ax.axhline(y, linestyle="--", linewidth=1, color="#C44E52")
        ax.annotate(label, (len(labels) - 0.5, y), ha="right", va="bottom", fontsize=8, color="#C44E52")
    ax.margins(y=0.12)  # room for the value above the tallest bar
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return save_figure(fig, path)
