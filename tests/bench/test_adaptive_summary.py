"""``benchmarks._adaptive_summary``: the table and the goals of ``bench_thor_adaptive`` from made-up runs.

Adaptive THOR with several momenta gets one row per momentum (never "the best momentum": that would be a
grid the user has to search), and the goals judge the first momentum given; a grid is its best setting,
averaged over seeds first."""
import math

import pytest

from benchmarks._adaptive_summary import average_seeds, summarise


def _run(kind, final, seed=1, lr=None, damping=None, momentum=None, seconds=None, nan=False, step_ms=10.0):
    return {"task": "lenet", "kind": kind, "lr": lr, "damping": damping, "momentum": momentum, "seed": seed,
            "final": float("nan") if nan else final, "final_loss": 0.1, "nan": nan, "nan_step": 3 if nan else None,
            "seconds_to_target": seconds, "train_seconds": 5.0, "median_step_ms": step_ms, "wall_seconds": 6.0,
            "curve": [[5, 1.0, final]]}


def _runs():
    runs = []
    for seed, shift in ((1, 0.0), (2, 0.02)):
        runs += [_run("adaptive", 0.90 + shift, seed, "adaptive", "adaptive", 0.9, seconds=2.0, step_ms=20.0),
                 _run("adaptive", 0.96 + shift, seed, "adaptive", "adaptive", 0.8, seconds=1.0, step_ms=20.0),
                 _run("thor", 0.93 + shift, seed, 0.03, 0.1, 0.9, seconds=3.0),
                 _run("thor", 0.0, seed, 0.1, 0.1, 0.9, nan=seed == 2),
                 _run("momentum", 0.80 + shift, seed, 0.03, None, 0.9, seconds=None)]
    return runs


def test_each_momentum_is_a_setting_of_its_own_averaged_over_seeds():
    averaged = average_seeds(_runs())
    adaptive = [r for r in averaged if r["kind"] == "adaptive"]
    assert [r["momentum"] for r in adaptive] == [0.9, 0.8]
    assert [r["final"] for r in adaptive] == pytest.approx([0.91, 0.97])
    assert adaptive[1]["finals"] == pytest.approx([0.96, 0.98])
    assert math.isnan(next(r for r in averaged if r["lr"] == 0.1)["final"])  # a seed went NaN


def test_table_has_a_row_per_momentum_and_the_goals_judge_the_first():
    summary = summarise(_runs(), ["lenet"])
    rows = [(r["kind"], r["momentum"]) for r in summary["table"]]
    assert rows == [("adaptive", 0.9), ("adaptive", 0.8), ("thor", 0.9), ("momentum", 0.9)]
    first, second, thor, _ = summary["table"]
    assert first["final"] == pytest.approx(0.91) and second["final"] == pytest.approx(0.97)
    assert (first["runs"], first["nan_runs"]) == (1, 0)
    assert (thor["lr"], thor["runs"], thor["nan_runs"]) == (0.03, 2, 1) and thor["final"] == pytest.approx(0.94)
    goals = summary["goals"]
    # momentum 0.9 ends at 0.91 against THOR's 0.94: not within 1 point, though momentum 0.8 (0.97) would be
    assert goals["within_1_point"] == {"lenet": False}
    assert goals["beats_momentum_time"] == {"lenet": True}  # Momentum never reached the target
    assert goals["step_cost_vs_thor"]["lenet"] == pytest.approx(2.0)


def test_runs_saved_without_a_momentum_still_summarise():
    """Results written before runs recorded their momentum (one adaptive momentum per file) still load."""
    runs = [r for r in _runs() if r["momentum"] != 0.8]
    for run in runs:
        del run["momentum"]
    summary = summarise(runs, ["lenet"])
    assert [r["kind"] for r in summary["table"]] == ["adaptive", "thor", "momentum"]
    assert summary["table"][0]["finals"] == pytest.approx([0.90, 0.92]) and summary["table"][0]["momentum"] is None


def test_plot_draws_every_momentum_and_names_a_nan_one(monkeypatch, tmp_path):
    """The plot shows each adaptive momentum (the first bold) and lists one that went NaN in the legend."""
    import benchmarks.bench_thor_adaptive as bench

    runs = _runs()
    runs[1].update(nan=True, nan_step=7, final=float("nan"), curve=[])  # seed 1, momentum 0.8
    drawn = {}

    def keep(fig, path):
        drawn["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        drawn["widths"] = [line.get_linewidth() for line in fig.axes[0].get_lines()
                           if len(line.get_xdata()) and not line.get_label().startswith("_")]

    monkeypatch.setattr(bench, "save_figure", keep)
    bench.plot(str(tmp_path / "p.png"), runs, ["lenet"], "title")
    assert drawn["labels"] == ["adaptive momentum 0.9: 0.910", "adaptive momentum 0.8: NaN at step 7",
                               "thor lr 0.03 d 0.1: 0.940 (1/2 NaN)", "momentum lr 0.03: 0.810"]
    assert drawn["widths"][0] == 2.2 and drawn["widths"][1:] == [1.2, 1.2]


def test_lr_multiples_goals_from_the_best_grid_runs():
    """``--lr-multiples``: a row per multiple; at 3x within 2 points of the best grid THOR, at 10x above the best
    grid Momentum, no damping run non-finite; the cost from the 1x run against the best THOR's step."""
    from benchmarks._adaptive_multiples import summarise_multiples

    def run(kind, final, lr, multiple=None, nan=False, step_ms=10.0):
        return dict(_run(kind, final, lr=lr, nan=nan, step_ms=step_ms), multiple=multiple, rejected_steps=2,
                    steps=44)

    runs = [run("thor", 0.93, 0.03), run("thor", 0.0, 0.1, nan=True), run("momentum", 0.70, 0.03),
            run("damping", 0.94, 0.03, 1, step_ms=16.0), run("damping", 0.915, 0.09, 3),
            run("thor", 0.0, 0.09, 3, nan=True), run("damping", 0.69, 0.3, 10), run("thor", 0.0, 0.3, 10, nan=True)]
    summary = summarise_multiples(runs, ["lenet"], [1, 3, 10])
    assert [(row["multiple"], row["final"], row["fixed_damping_nan"]) for row in summary["table"]] == [
        (1, 0.94, None), (3, 0.915, True), (10, 0.69, True)]
    assert summary["table"][0]["best_thor"] == 0.93 and summary["table"][0]["best_momentum"] == 0.70
    goals = summary["goals"]
    assert goals["within_2_points_at_3x"] == {"lenet": True} and goals["above_momentum_at_10x"] == {"lenet": False}
    assert goals["step_cost_vs_thor"] == {"lenet": pytest.approx(1.6)} and goals["never_nan"]
    assert goals["met"] == {"never_nan": True, "within_2_points_at_3x": True, "above_momentum_at_10x": False}
    runs[4] = run("damping", 0.0, 0.09, 3, nan=True)
    assert summarise_multiples(runs, ["lenet"], [1, 3, 10])["goals"]["met"]["never_nan"] is False


@pytest.mark.parametrize("stem", ["bench_thor_adaptive_lr_multiples", "bench_thor_adaptive_cost"])
def test_replot_redraws_the_lr_multiples_and_cost_figures(tmp_path, stem):
    """``--replot`` with ``--out`` at a saved ``--lr-multiples`` or ``--cost`` record redraws that record's own
    figure (not the main benchmark's) from its JSON alone: nothing is trained."""
    import os
    import shutil

    from benchmarks.bench_thor_adaptive import main

    results = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results")
    shutil.copy(os.path.join(results, stem + ".json"), tmp_path / (stem + ".json"))
    assert main(["--replot", "--out", str(tmp_path / stem)]) == 0
    png = tmp_path / (stem + ".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_records_keep_every_value_with_scalar_arrays_on_one_line():
    """``dumps_record``: the record reads back as it was (NaN, inf, nested lists, strings with commas), and an
    array of scalars takes one line, so a long curve is not a line per number."""
    import json

    from benchmarks._common import dumps_record

    record = {"command": "python x.py --a 1,2", "runs": [{"curve": [[5, 1.5, 0.25], [10, 3.0, float("nan")]],
                                                         "losses": [2.5, -1e-07, float("inf"), None, True],
                                                         "names": ["a, b", "c"]}], "empty": []}
    text = dumps_record(record)
    assert json.dumps(json.loads(text)) == json.dumps(record)
    assert "[2.5, -1e-07, Infinity, null, true]" in text and "[10, 3.0, NaN]" in text
    assert text.endswith("\n")
