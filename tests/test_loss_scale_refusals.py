"""A loss scale that cannot train is refused, not run (``ms_optim._loss_scale_checks``).

With a loss scale that is NaN, infinite or 0 every step counts as an overflow and is skipped, so the
parameters never move and nothing says why; MindSpore accepts such scales. ms_optim refuses them:

* ``TrainOneStepWithLossScaleCell(..., scale_sense)``: a Tensor that is not finite or not > 0 (ValueError),
  a bool or integer Tensor (TypeError), a Cell that is not a loss-scale update cell (TypeError), an update
  cell whose initial scale or ``scale_factor`` is not finite or not > 0 (ValueError); ``set_sense_scale`` the same;
* while training, a dynamic manager's scale that reaches infinity or 0 stops the run before the step that
  would use it (ValueError naming the scale and the step); the parameters stay as after the last good step;
* ``Model`` (under ``ms_optim.use()``) and ``ModelThor`` give one error for one manager.

Every error names the argument and shows the value; every case runs in both modes.
"""
import math

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, context, nn, ops

import ms_optim
from ms_optim import _float16_add
from ms_optim.nn import TrainOneStepWithLossScaleCell
from ms_optim.train_thor import ModelThor

LR, MOMENTUM = 0.1, 0.9


# ---------------------------------------------------------------------------------------------- helpers
def _net(rng):
    net = nn.Dense(4, 3)
    net.weight.set_data(Tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    net.bias.set_data(Tensor(rng.standard_normal(3).astype(np.float32)))
    return net


def _data(rng, batch=6):
    return (rng.standard_normal((batch, 4)).astype(np.float32), rng.standard_normal((batch, 3)).astype(np.float32))


def _momentum_steps(params, x, y, steps):
    """float64 parameters after ``steps`` Momentum steps (lr LR, momentum MOMENTUM) of MSELoss on one batch."""
    w, b = (np.asarray(p, np.float64) for p in params)
    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    moments = [np.zeros_like(w), np.zeros_like(b)]
    for _ in range(steps):
        d = 2.0 * (xs @ w.T + b - ys) / ys.size
        grads = [d.T @ xs, d.sum(axis=0)]
        moments = [MOMENTUM * m + g for m, g in zip(moments, grads)]
        w, b = w - LR * moments[0], b - LR * moments[1]
    return w, b


def _cell(rng, scale_sense):
    net = _net(rng)
    opt = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
    return net, opt, TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, scale_sense)


def _state(*cells):
    return {p.name: p.asnumpy().copy() for cell in cells for p in cell.get_parameters()}


def _assert_names(message, *parts):
    for part in parts:
        assert part in message, (part, message)


class _HalvingUpdateCell(nn.Cell):
    """A loss-scale update cell of the user's own: halves the scale on overflow, keeps it otherwise."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def get_loss_scale(self):
        return self.scale

    def construct(self, loss_scale, overflow):
        ops.assign(loss_scale, ops.select(overflow, loss_scale * 0.5, loss_scale))
        return overflow


class _ScaleWithoutUpdate(nn.Cell):
    """Has get_loss_scale() but a construct that does not take (loss_scale, overflow)."""

    def get_loss_scale(self):
        return 1024.0

    def construct(self, x):
        return x


# ---------------------------------------------------------------------------------------------- at construction
@pytest.mark.parametrize("value,shown", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (0.0, "0.0"),
                                         (-1024.0, "-1024.0"), ([math.nan], "nan")])
def test_tensor_scale_not_finite_or_not_positive_is_refused(mode, rng, value, shown):
    with pytest.raises(ValueError) as info:
        _cell(rng, Tensor(np.asarray(value, np.float32)))
    _assert_names(str(info.value), "'scale_sense'", "finite loss scale > 0", f"but got {shown} ")


@pytest.mark.parametrize("tensor,shown", [(Tensor(True), "Bool: True"), (Tensor(1024, ms.int32), "Int32: 1024"),
                                          (Tensor([8], ms.int64), "Int64: 8"), (Tensor(2, ms.uint8), "UInt8: 2")])
def test_bool_or_integer_tensor_scale_is_refused(mode, rng, tensor, shown):
    with pytest.raises(TypeError) as info:
        _cell(rng, tensor)
    _assert_names(str(info.value), "'scale_sense'", "floating-point Tensor", shown)


@pytest.mark.parametrize("make,shown", [(lambda: nn.Dense(2, 2), "Dense"), (_ScaleWithoutUpdate, "_ScaleWithoutUpdate"),
                                        (lambda: 1024.0, "float 1024.0")])
def test_scale_sense_that_is_not_an_update_cell_is_refused_when_built(mode, rng, make, shown):
    with pytest.raises(TypeError) as info:
        _cell(rng, make())
    _assert_names(str(info.value), "'scale_sense'", "loss-scale update cell", shown)


@pytest.mark.parametrize("make,shown", [
    (lambda: nn.DynamicLossScaleUpdateCell(math.nan, 2, 10), "get_loss_scale(), but got nan"),
    (lambda: nn.DynamicLossScaleUpdateCell(math.inf, 2, 10), "get_loss_scale(), but got inf"),
    (lambda: nn.FixedLossScaleUpdateCell(0), "get_loss_scale(), but got 0"),
    (lambda: nn.FixedLossScaleUpdateCell(-4.0), "get_loss_scale(), but got -4.0"),
    (lambda: _HalvingUpdateCell(math.nan), "get_loss_scale(), but got nan"),
    (lambda: nn.DynamicLossScaleUpdateCell(1024.0, math.nan, 10), "scale_factor > 0, but got nan"),
])
def test_update_cell_with_a_scale_that_cannot_train_is_refused(mode, rng, make, shown):
    with pytest.raises(ValueError) as info:
        _cell(rng, make())
    _assert_names(str(info.value), "'scale_sense'", shown)


def test_set_sense_scale_refuses_as_the_constructor(mode, rng):
    _, _, cell = _cell(rng, Tensor(1024.0))
    with pytest.raises(ValueError) as info:
        cell.set_sense_scale(Tensor(math.inf))
    _assert_names(str(info.value), "'scale_sense'", "but got inf")
    assert float(cell.scale_sense.asnumpy()) == 1024.0


@pytest.mark.parametrize("scale_sense", [lambda: Tensor([512.0]), lambda: _HalvingUpdateCell(512.0)])
def test_usable_scale_and_users_update_cell_train(mode, rng, scale_sense):
    """A (1,)-shaped Tensor and any Cell with the update-cell interface are accepted, and train as Momentum."""
    net, _, cell = _cell(rng, scale_sense())
    start = [net.weight.asnumpy().copy(), net.bias.asnumpy().copy()]
    x, y = _data(rng)
    _, overflow, scale = cell(Tensor(x), Tensor(y))
    assert not bool(overflow.asnumpy()) and float(scale.asnumpy().reshape(())) == 512.0
    want = _momentum_steps(start, x, y, 1)
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- while training
@pytest.mark.parametrize("init,factor,good_steps,shown", [
    (2.0 ** 120, 2.0 ** 10, 1, "inf"),   # 2^120 -> 2^130: not a float32, infinite after step 1
    (1.0, 2.0 ** -100, 2, "0"),          # 1 -> 2^-100 -> 2^-200: 0 in float32 after step 2
], ids=["to_inf", "to_zero"])
def test_dynamic_scale_that_reaches_inf_or_zero_stops_the_run(mode, rng, init, factor, good_steps, shown):
    net, opt, cell = _cell(rng, nn.DynamicLossScaleUpdateCell(init, factor, 1))
    start = [net.weight.asnumpy().copy(), net.bias.asnumpy().copy()]
    x, y = _data(rng)
    for _ in range(good_steps):
        _, overflow, _ = cell(Tensor(x), Tensor(y))
        assert not bool(overflow.asnumpy())
    after_good = _state(cell, opt)
    with pytest.raises(ValueError) as info:
        cell(Tensor(x), Tensor(y))
    _assert_names(str(info.value), "'scale_sense'", f"but it is {shown}", f"at step {good_steps + 1}",
                  f"as after step {good_steps}")
    after_refused = _state(cell, opt)
    assert set(after_refused) == set(after_good) and len(after_good) > 4  # weights, moments, counters, scale
    for name, value in after_good.items():
        np.testing.assert_array_equal(after_refused[name], value, err_msg=name)
    want = _momentum_steps(start, x, y, good_steps)
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)
    assert int(cell.loss_scale_step.asnumpy()) == good_steps


def test_refused_step_runs_nothing_not_even_the_forward_pass(mode, rng):
    """BatchNorm's moving statistics, updated by a training forward pass, stay as after the last good step:
    the check comes before the step's forward pass, not only before its optimizer."""
    net = nn.SequentialCell([_net(rng), nn.BatchNorm1d(3)])
    opt = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
    cell = TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt,
                                         nn.DynamicLossScaleUpdateCell(2.0 ** 120, 2.0 ** 10, 1)).set_train()
    x, y = _data(rng)
    initial = _state(net)
    cell(Tensor(x), Tensor(y))
    after_good = _state(cell, opt)
    moving = [name for name in initial if "moving" in name]
    assert len(moving) == 2 and all(not np.array_equal(after_good[n], initial[n]) for n in moving)
    with pytest.raises(ValueError, match=r"'scale_sense'.*inf at step 2"):
        cell(Tensor(x), Tensor(y))
    after_refused = _state(cell, opt)
    for name, value in after_good.items():
        np.testing.assert_array_equal(after_refused[name], value, err_msg=name)


def _model(kind, net, opt, manager):
    if kind == "Model":
        with ms_optim.use(verbose=False):
            return ms.train.Model(net, nn.MSELoss(), opt, loss_scale_manager=manager)
    return ModelThor(net, nn.MSELoss(), opt, loss_scale_manager=manager)


@pytest.fixture
def mindspores_add():
    """ModelThor installs the float16 add on CPU: leave the process's ``+`` as this test found it."""
    was_installed = _float16_add._STATE["installed"]
    yield
    (ms_optim.float16_add_via_float32 if was_installed else ms_optim.restore_float16_add)()


@pytest.mark.parametrize("kind", ["Model", "ModelThor"])
def test_model_and_model_thor_stop_when_the_scale_reaches_inf(mode, rng, mindspores_add, kind):
    net = _net(rng)
    start = [net.weight.asnumpy().copy(), net.bias.asnumpy().copy()]
    opt = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
    manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0 ** 120, scale_factor=2 ** 10, scale_window=1)
    model = _model(kind, net, opt, manager)
    x, y = _data(rng)
    data = ds.NumpySlicesDataset({"x": np.concatenate([x] * 3), "y": np.concatenate([y] * 3)},
                                 shuffle=False).batch(len(x))
    with pytest.raises(ValueError) as info:
        model.train(1, data, dataset_sink_mode=False)
    _assert_names(str(info.value), "'scale_sense'", "but it is inf", "at step 2")
    want = _momentum_steps(start, x, y, 1)
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- managers
_MANAGERS = [
    ("FixedLossScaleManager(nan, False)", lambda: ms.amp.FixedLossScaleManager(math.nan, drop_overflow_update=False),
     ValueError, ("'loss_scale_manager'", "FixedLossScaleManager", "'loss_scale'", "but got nan")),
    ("FixedLossScaleManager(inf)", lambda: ms.amp.FixedLossScaleManager(math.inf),
     ValueError, ("'loss_scale_manager'", "FixedLossScaleManager", "'loss_scale'", "but got inf")),
    ("DynamicLossScaleManager(init nan)", lambda: ms.amp.DynamicLossScaleManager(init_loss_scale=math.nan),
     ValueError, ("'loss_scale_manager'", "DynamicLossScaleManager", "'init_loss_scale'", "but got nan")),
    ("DynamicLossScaleManager(factor inf)", lambda: ms.amp.DynamicLossScaleManager(scale_factor=math.inf),
     ValueError, ("'loss_scale_manager'", "DynamicLossScaleManager", "'scale_factor'", "but got inf")),
    ("FixedLossScaleManager(0)", lambda: ms.amp.FixedLossScaleManager(0),  # MindSpore's own refusal (< 1)
     ValueError, ("'loss_scale'", "but got 0")),
]


@pytest.mark.parametrize("case", _MANAGERS, ids=[case[0] for case in _MANAGERS])
def test_model_and_model_thor_refuse_one_manager_with_one_error(mode, rng, mindspores_add, case):
    _, make, error, parts = case
    messages = []
    for kind in ("Model", "ModelThor"):
        net = _net(rng)
        before = net.weight.asnumpy().copy()
        opt = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
        with pytest.raises(error) as info:
            _model(kind, net, opt, make())
        _assert_names(str(info.value), *parts)
        messages.append(str(info.value))
        np.testing.assert_array_equal(net.weight.asnumpy(), before)
    assert messages[0] == messages[1]


# ---------------------------------------------------------------------------------------------- float16 add
def _casts_in_compiled_float16_add(tmp_path) -> int:
    """Compile ``x + y`` of two float16 tensors in GRAPH mode and count the casts in its validated IR."""

    class _Sum(nn.Cell):
        def construct(self, a, b):
            return a + b

    previous = context.get_context("mode")
    context.set_context(mode=context.GRAPH_MODE, save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        _Sum()(Tensor(np.ones((2, 3), np.float16)), Tensor(np.ones((2, 3), np.float16)))
    finally:
        context.set_context(mode=previous, save_graphs=0)
    return sorted(tmp_path.rglob("*validate*.ir"))[-1].read_text().count("PrimFunc_Cast")


def test_restore_float16_add_is_public_and_undoes_model_thors_install(mode, rng, mindspores_add, tmp_path):
    assert ms_optim.restore_float16_add is _float16_add.restore_float16_add
    assert {"float16_add_via_float32", "restore_float16_add"} <= set(ms_optim.__all__)
    ms_optim.restore_float16_add()
    net = _net(rng)
    ModelThor(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), LR, MOMENTUM))
    assert _float16_add._STATE["installed"]  # on CPU, when ModelThor builds its training cell
    ms_optim.restore_float16_add()
    assert not _float16_add._STATE["installed"]
    assert _casts_in_compiled_float16_add(tmp_path) == 0  # MindSpore's float16 Add again, no float32 casts
