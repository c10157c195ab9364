"""``thor(..., trace_thresholds=...)``, THOR's trace rule (``ms_optim/_thor/trace.py``), vs the NumPy
float64 oracle ``reference/thor_trace_ref.py``, in PYNATIVE and GRAPH mode.

* the rule step by step: on every THOR step, which layers are re-inverted (every band of the rule is
  exercised: first, large change, moderate change with the interval due, moderate change not due, small
  change), the state (T^last, c, m, n_inv) and every parameter after every step (rtol 1e-3), for a pair
  of thresholds and for a single number;
* thresholds 0 give the fixed schedule bit for bit; very large thresholds keep the first inverses;
* a checkpoint of the training cell round-trips the trace state and the resumed run continues exactly;
* Model (non-sink) and ModelThor (sink, unaligned sink size) make the decisions of TrainOneStepCell;
* validation: TypeError/ValueError naming 'trace_thresholds' and the value, before the net is converted.
"""
import math

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model
from reference.thor_ref import MLPRef
from reference.thor_trace_ref import ThorTraceReference
from support.nets import MLP
from support.params import param_values
from support.thor_runs import init_params, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.model import ConvertModelUtils
from ms_optim._thor.net.layers import ThorLayer

RTOL = 1e-3
ATOL = 1e-6
FREQ = 2
# Squared input scale per step, on one fixed batch with a small learning rate: T = tr(A) tr(G) moves by
# designed amounts on the THOR steps (0, 2, ..., 14). With (omega_1, omega_2) = (0.5, 0.1) this gives,
# for both layers: first, due (m -> 2), moderate but not due, due (m -> 4), small, large (m -> 1), due,
# moderate but not due.
SCALES = [1.0, 1.0, 1.2, 1.2, 1.45, 1.45, 1.6, 1.6, 1.62, 1.62, 3.2, 3.2, 3.3, 3.3, 3.32, 3.32]
STEPS = len(SCALES)
PAIR = (0.5, 0.1)
MARGIN = 5e-3  # every oracle Delta is this far from the thresholds (float32 vs float64 cannot flip a decision)


def _batches(rng, steps=STEPS):
    x = rng.standard_normal((16, 20))
    y = rng.integers(0, 10, 16).astype(np.int32)
    return [((x * math.sqrt(SCALES[t % len(SCALES)])).astype(np.float32), y) for t in range(steps)]


def _state(opt):
    tr = opt.trace
    return {"last": np.array([float(p.asnumpy()) for p in tr.last_trace]),
            "since": [int(p.asnumpy()) for p in tr.since], "interval": [int(p.asnumpy()) for p in tr.interval],
            "inversions": [int(p.asnumpy()) for p in tr.inversions]}


def _setup(rng, thresholds, lr=0.003, damping=0.03, steps=STEPS):
    net = MLP()
    init_params(net, rng)
    lr_s = np.full(steps, lr, np.float32)
    damping_s = np.full(steps, damping, np.float32)
    opt = thor(net, Tensor(lr_s), Tensor(damping_s), 0.9, batch_size=16, frequency=FREQ,
               trace_thresholds=thresholds)
    return net, opt, lr_s, damping_s


@pytest.mark.parametrize("thresholds", [PAIR, 0.15], ids=["pair", "single"])
def test_rule_matches_reference_step_by_step(mode, rng, thresholds):
    net, opt, lr, damping = _setup(rng, thresholds)
    ref = ThorTraceReference(MLPRef(), param_values(net), lr, damping, 0.9, batch_size=16, frequency=FREQ,
                             trace_thresholds=thresholds)
    cell = train_cell(net, opt)
    names = [name for name, _ in MLPRef.layers]
    for t, (x, y) in enumerate(_batches(rng)):
        before = _state(opt)["inversions"]
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL, err_msg=f"loss at step {t}")
        state = _state(opt)
        refreshed = [after - b for after, b in zip(state["inversions"], before)]
        if t % FREQ == 0:
            decision = ref.decisions[t]
            assert refreshed == [int(decision[n][1]) for n in names], (t, decision)
            for n in names:
                delta = decision[n][0]
                gap = min(abs(delta - w) for w in (ref.omega_1, ref.omega_2))
                assert not math.isfinite(delta) or gap > MARGIN, (t, n, delta)
        else:
            assert refreshed == [0, 0], t
        assert state["since"] == [ref.since[n] for n in names], t
        assert state["interval"] == [ref.interval[n] for n in names], t
        assert state["inversions"] == [ref.inversions[n] for n in names], t
        np.testing.assert_allclose(state["last"], [ref.last_trace[n] for n in names], rtol=RTOL)
        for name, want in ref.params.items():
            np.testing.assert_allclose(param_values(net)[name], want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"parameter {name} after step {t}")
    bands = {decision[n][2] for decision in ref.decisions.values() for n in names}
    if thresholds == PAIR:
        assert bands == {"first", "due", "skip-mid", "skip-low", "large"}, bands
    else:
        assert {"first", "large", "skip-low"} <= bands, bands
    assert sum(ref.inversions.values()) < len(names) * len(ref.decisions)  # some inversions were skipped


def _run_plain(rng_seed, thresholds, batches):
    net, opt, _, _ = _setup(np.random.default_rng(rng_seed), thresholds, lr=0.05)
    cell = train_cell(net, opt)
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
    return net, opt


def test_zero_thresholds_are_the_fixed_schedule_exactly(mode, rng):
    batches = [(rng.standard_normal((16, 20)).astype(np.float32), rng.integers(0, 10, 16).astype(np.int32))
               for _ in range(7)]
    fixed, fixed_opt = _run_plain(3, None, batches)
    assert fixed_opt.trace is None
    for zero in (0.0, 0, (0.0, 0.0)):
        net, opt = _run_plain(3, zero, batches)
        assert _state(opt)["inversions"] == [4, 4]  # THOR steps 0, 2, 4, 6
        for name, value in param_values(fixed).items():
            np.testing.assert_array_equal(param_values(net)[name], value, err_msg=f"{name} ({zero!r})")
        for a, b in zip(opt.matrix_a_inv + opt.matrix_g_inv, fixed_opt.matrix_a_inv + fixed_opt.matrix_g_inv):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=a.name)


def test_huge_thresholds_keep_the_first_inverses(mode, rng):
    batches = [(rng.standard_normal((16, 20)).astype(np.float32) * (1 + s), rng.integers(0, 10, 16).astype(np.int32))
               for s in range(7)]
    net, opt, _, _ = _setup(np.random.default_rng(5), 1e30, lr=0.05)
    cell = train_cell(net, opt)
    cell(Tensor(batches[0][0]), Tensor(batches[0][1]))
    first = [p.asnumpy().copy() for p in opt.matrix_a_inv + opt.matrix_g_inv]
    assert not all(np.array_equal(f, np.eye(f.shape[-1])[None]) for f in first)  # step 0 did invert
    for x, y in batches[1:]:
        cell(Tensor(x), Tensor(y))
    assert _state(opt)["inversions"] == [1, 1] and _state(opt)["since"] == [3, 3]
    for f, p in zip(first, opt.matrix_a_inv + opt.matrix_g_inv):
        np.testing.assert_array_equal(p.asnumpy(), f, err_msg=p.name)
    # the factors did change (the layers collected them on every THOR step): the thresholds held the inverses
    np.testing.assert_allclose(net.fc1.matrix_a_cov.asnumpy(), batches[6][0].T @ batches[6][0] / 16, rtol=1e-4,
                               atol=1e-5)


def test_checkpoint_round_trips_the_trace_state(mode, rng, tmp_path):
    """Save after 5 steps (layer state m = 2, c = 1: a moderate change on step 6 will be 'due'), load into
    a fresh net and optimizer, continue: the same decisions and parameters as the uninterrupted run."""
    batches = _batches(rng)
    seed = 11
    net, opt, _, _ = _setup(np.random.default_rng(seed), PAIR)
    cell = train_cell(net, opt)
    for x, y in batches[:5]:
        cell(Tensor(x), Tensor(y))
    saved = _state(opt)
    assert saved["interval"] == [2, 2] and saved["since"] == [1, 1] and saved["inversions"] == [2, 2]
    path = str(tmp_path / "trace.ckpt")
    ms.save_checkpoint(cell, path)
    assert {f"thor_{k}_{i}" for k in ("trace_last", "trace_since", "trace_interval", "inversions")
            for i in (0, 1)} <= set(ms.load_checkpoint(path))
    for x, y in batches[5:]:
        cell(Tensor(x), Tensor(y))

    net2, opt2, _, _ = _setup(np.random.default_rng(99), PAIR)  # other initial values: all must come from the file
    cell2 = train_cell(net2, opt2)
    not_loaded, _ = ms.load_param_into_net(cell2, ms.load_checkpoint(path))
    assert not [n for n in not_loaded if "thor_" in n]
    loaded = _state(opt2)
    np.testing.assert_array_equal(loaded["last"], saved["last"])
    assert {k: loaded[k] for k in ("since", "interval", "inversions")} == \
        {k: saved[k] for k in ("since", "interval", "inversions")}
    for x, y in batches[5:]:
        cell2(Tensor(x), Tensor(y))
    assert {k: _state(opt2)[k] for k in ("since", "interval", "inversions")} == \
        {k: _state(opt)[k] for k in ("since", "interval", "inversions")}
    np.testing.assert_array_equal(_state(opt2)["last"], _state(opt)["last"])
    for name, value in param_values(net).items():
        np.testing.assert_array_equal(param_values(net2)[name], value, err_msg=name)


def _dataset(batches):
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    data = ds.NumpySlicesDataset({"x": x, "y": y.reshape(-1, 1)}, shuffle=False)
    data = data.map(lambda v: v.reshape(()), input_columns="y")
    return data.batch(16, drop_remainder=True)


def test_model_and_model_thor_make_the_same_decisions(rng):
    """TrainOneStepCell, Model (non-sink) and ModelThor (sink, sink size 3: THOR steps inside and at the
    edges of sinks) over the same 12 batches: equal counters, state and parameters."""
    ms.set_context(mode=ms.GRAPH_MODE)
    batches = _batches(rng)[:12]
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    ref_net, ref_opt, _, _ = _setup(np.random.default_rng(2), PAIR)
    cell = train_cell(ref_net, ref_opt)
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
    want = _state(ref_opt)
    assert want["inversions"] != [6, 6]  # some THOR steps skipped

    runs = []
    net, opt, _, _ = _setup(np.random.default_rng(2), PAIR)
    Model(net, loss, opt).train(1, _dataset(batches), dataset_sink_mode=False)
    runs.append(("Model", net, opt))
    net, opt, _, _ = _setup(np.random.default_rng(2), PAIR)
    model = ConvertModelUtils.convert_to_thor_model(None, net, loss_fn=loss, optimizer=opt)
    model.train(4, _dataset(batches), dataset_sink_mode=True, sink_size=3)
    runs.append(("ModelThor sink", net, opt))
    for label, net, opt in runs:
        got = _state(opt)
        assert {k: got[k] for k in ("since", "interval", "inversions")} == \
            {k: want[k] for k in ("since", "interval", "inversions")}, label
        np.testing.assert_allclose(got["last"], want["last"], rtol=1e-5, err_msg=label)
        for name, value in param_values(ref_net).items():
            np.testing.assert_allclose(param_values(net)[name], value, rtol=1e-5, atol=1e-7,
                                       err_msg=f"{label}: {name}")


# ----------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("value, exc, text", [
    ("0.1", TypeError, "'0.1'"),
    (True, TypeError, "True"),
    ((0.1, "a"), TypeError, "(0.1, 'a')"),
    ({0.1}, TypeError, "set"),
    (float("nan"), ValueError, "nan"),
    (-0.1, ValueError, "-0.1"),
    (float("inf"), ValueError, "inf"),
    ((0.1, -1.0), ValueError, "(0.1, -1.0)"),
    ((0.1, 0.2), ValueError, "(0.1, 0.2)"),
    ((0.1, 0.05, 0.01), ValueError, "(0.1, 0.05, 0.01)"),
    ([0.1], ValueError, "[0.1]"),
    (1e39, ValueError, "1e+39"),
])
def test_refusals_name_the_argument_and_leave_the_net(value, exc, text):
    net = MLP(6, 5, 3)
    with pytest.raises(exc, match="trace_thresholds") as info:
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, trace_thresholds=value)
    assert text in str(info.value)
    assert not any(isinstance(c, ThorLayer) for _, c in net.cells_and_names())  # not converted


def test_accepted_values():
    for value, want in ((None, None), (0.2, (0.2, 0.2)), (3, (3.0, 3.0)), ((0.5, 0.1), (0.5, 0.1)),
                        ([0.5, 0.5], (0.5, 0.5)), (np.float32(0.25), (0.25, 0.25))):
        opt = thor(MLP(6, 5, 3), Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, trace_thresholds=value)
        assert (opt.trace.thresholds if opt.trace is not None else None) == want
