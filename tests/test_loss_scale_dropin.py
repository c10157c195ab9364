"""Loss-scaled training of unmodified MindSpore code on CPU under ``ms_optim.use()``.

MindSpore 2.10's ``nn.TrainOneStepWithLossScaleCell`` fails on CPU at its first step (an Ascend-only
status op), and ``Model`` refuses ``DynamicLossScaleManager``/``FixedLossScaleManager(drop_overflow_update=
True)`` on CPU up front. Under ``use()``:

* every path a script reaches the class by (``mindspore.nn``, ``mindspore.nn.wrap``,
  ``mindspore.nn.wrap.loss_scale``) and ``build_train_network`` (``mindspore.amp``, ``mindspore.train``,
  ``mindspore.train.amp``, what ``Model`` calls) are ms_optim's; undo puts MindSpore's objects back;
* subclasses written as the zoo writes them (``tests/support/loss_scale_cells.py``) train: a clean step
  equals a float64 NumPy step of the clipped gradient (Momentum, Adam, ms_optim's Lamb); an overflowing step
  leaves the parameters and every optimizer state Parameter untouched and halves the scale;
* ``Model`` with both managers builds the portable cell and skips an overflowing batch.
The data-parallel version (2 msrun ranks) is tests/distributed/test_loss_scale_parallel.py.
"""
import mindspore as ms
import mindspore.dataset as ds
import mindspore.nn as ms_nn
import mindspore.nn.wrap as ms_wrap
import mindspore.nn.wrap.loss_scale as ms_loss_scale
import mindspore.train as ms_train
import mindspore.train.amp as ms_train_amp
import numpy as np
import pytest
from mindspore import Parameter, Tensor
from reference.lamb_ref import LambReference
from support.loss_scale_cells import CLIP_GLOBAL_NORM, CLIP_NORM, zoo_cells

import ms_optim
from ms_optim.loss_scale import TrainOneStepWithLossScaleCell

INIT_SCALE = 2.0 ** 10
B1, B2 = 0.9, 0.999


def _homes():
    """(module, attribute) of every path to the cell and to build_train_network that scripts use."""
    cell = [(m, "TrainOneStepWithLossScaleCell") for m in (ms_nn, ms_wrap, ms_loss_scale)]
    build = [(m, "build_train_network") for m in (ms.amp, ms_train, ms_train_amp)]
    return cell + build


def _data(rng, batch=6):
    x = (rng.standard_normal((batch, 4)) * 2.0).astype(np.float32)
    y = rng.standard_normal((batch, 3)).astype(np.float32)
    return x, y


def _net(rng):
    net = ms_nn.Dense(4, 3)
    net.weight.set_data(Tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    net.bias.set_data(Tensor(rng.standard_normal(3).astype(np.float32)))
    return net


def _grads(w, b, x, y):
    """float64 gradients of MSELoss (mean over all elements) of x @ w.T + b."""
    x, y, w, b = (np.asarray(a, np.float64) for a in (x, y, w, b))
    d = 2.0 * (x @ w.T + b - y) / y.size
    return [d.T @ x, d.sum(axis=0)]


def _clip(kind, grads):
    if kind == "bert":  # per tensor
        return [g * CLIP_NORM / max(np.sqrt((g * g).sum()), CLIP_NORM) for g in grads]
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads))
    return [g * CLIP_GLOBAL_NORM / max(norm, CLIP_GLOBAL_NORM) for g in grads]


def _optimizer(name, params):
    if name == "momentum":
        return ms_nn.Momentum(params, 0.1, 0.9)
    if name == "adam":
        return ms_nn.Adam(params, 0.01)
    return ms_optim.nn.Lamb(params, 0.01)


def _first_step(name, params, grads):
    """float64 parameters after one step of ``name`` from ``params`` with ``grads``."""
    if name == "momentum":  # moment = g; w -= lr * moment
        return [p - 0.1 * g for p, g in zip(params, grads)]
    if name == "adam":  # m = (1-b1) g, v = (1-b2) g^2, lr_t = lr sqrt(1-b2)/(1-b1)
        lr_t = 0.01 * np.sqrt(1 - B2) / (1 - B1)
        return [p - lr_t * ((1 - B1) * g) / (np.sqrt((1 - B2) * g * g) + 1e-8) for p, g in zip(params, grads)]
    return LambReference(params).step(grads, [0.01] * len(params), [0.0] * len(params))


def _state(*cells):
    return {p.name: p.asnumpy().copy() for cell in cells for p in cell.get_parameters()}


@pytest.fixture
def patched():
    with ms_optim.use(verbose=False):
        yield


def test_use_replaces_every_path_and_undo_restores_exactly():
    before = {(m.__name__, name): getattr(m, name) for m, name in _homes()}
    assert before[("mindspore.nn", "TrainOneStepWithLossScaleCell")] is not TrainOneStepWithLossScaleCell
    with ms_optim.use(verbose=False):
        for module, name in _homes():
            want = TrainOneStepWithLossScaleCell if name.startswith("Train") else ms_optim.amp.build_train_network
            assert getattr(module, name) is want, (module.__name__, name)
    for module, name in _homes():
        assert getattr(module, name) is before[(module.__name__, name)], (module.__name__, name)
    assert ms_train_amp.build_train_network.__module__ == "mindspore.train.amp"


def test_six_line_repro_trains_on_cpu_under_use(patched, mode, rng):
    """The issue's six lines: MindSpore's class fails on CPU; under use() one step runs and updates."""
    net = _net(rng)
    w0 = net.weight.asnumpy().astype(np.float64)
    b0 = net.bias.asnumpy().astype(np.float64)
    opt = ms_nn.Momentum(net.trainable_params(), 0.1, 0.9)
    cell = ms_nn.TrainOneStepWithLossScaleCell(ms_nn.WithLossCell(net, ms_nn.MSELoss()), opt,
                                               scale_sense=Tensor(1024.0))
    x, y = _data(rng)
    _, overflow, scale = cell(Tensor(x), Tensor(y))
    assert not bool(overflow.asnumpy()) and float(scale.asnumpy()) == 1024.0
    want = _first_step("momentum", [w0, b0], _grads(w0, b0, x, y))
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "lamb"])
@pytest.mark.parametrize("kind", ["bert", "global_norm"])
def test_zoo_subclass_clean_step_updates_and_overflow_step_changes_nothing(patched, mode, rng, kind, optimizer):
    cls = zoo_cells()[kind]
    assert issubclass(cls, TrainOneStepWithLossScaleCell)
    net = _net(rng)
    w0 = net.weight.asnumpy().astype(np.float64)
    b0 = net.bias.asnumpy().astype(np.float64)
    opt = _optimizer(optimizer, net.trainable_params())
    manager = ms.amp.DynamicLossScaleManager(init_loss_scale=INIT_SCALE, scale_factor=2, scale_window=1000)
    cell = cls(ms_nn.WithLossCell(net, ms_nn.MSELoss()), opt, manager.get_update_cell()).set_train()
    # the attributes zoo subclasses read exist, with MindSpore's stand-alone values
    assert (cell.reducer_flag, cell.is_distributed, cell.degree) == (False, False, 1)
    assert cell.loss_scaling_manager is not None and isinstance(cell.scale_sense, Parameter)
    scale_of = (lambda: float(cell.loss_scale.asnumpy())) if kind == "bert" else (
        lambda: float(cell.scale_sense.asnumpy()))
    x, y = _data(rng)

    cell(Tensor(x), Tensor(y))  # clean step: the clipped gradient, one optimizer step
    raw = _grads(w0, b0, x, y)
    clipped = _clip(kind, raw)
    assert not np.allclose(clipped[0], raw[0])  # the clipping was active
    want = _first_step(optimizer, [w0, b0], clipped)
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)
    assert scale_of() == INIT_SCALE

    before = _state(net, opt)
    bad_x = x.copy()
    bad_x[1, 2] = np.inf
    out = cell(Tensor(bad_x), Tensor(y))
    if kind == "bert":
        assert bool(out[1].asnumpy())  # cond: overflow
    after = _state(net, opt)
    assert set(after) == set(before) and len(after) > 2  # weights and the optimizer's state and step
    for name, value in before.items():
        assert np.array_equal(value, after[name]), f"{name} changed on the overflowing step"
    assert scale_of() == INIT_SCALE / 2

    cell(Tensor(x), Tensor(y))  # a clean step updates again
    assert not np.array_equal(net.weight.asnumpy(), before[net.weight.name])


def _dataset(x, y, bad_first):
    """Two batches of x, y; the first with an inf input when ``bad_first``."""
    xs = np.concatenate([x, x])
    if bad_first:
        xs = xs.copy()
        xs[0, 0] = np.inf
    return ds.NumpySlicesDataset({"x": xs, "y": np.concatenate([y, y])}, shuffle=False).batch(len(x))


@pytest.mark.parametrize("manager_kind", ["dynamic", "fixed_drop"])
def test_model_with_skipping_manager_builds_the_portable_cell_on_cpu(patched, mode, rng, manager_kind):
    net = _net(rng)
    w0 = net.weight.asnumpy().astype(np.float64)
    b0 = net.bias.asnumpy().astype(np.float64)
    opt = ms_nn.Momentum(net.trainable_params(), 0.1, 0.9)
    manager = (ms.amp.DynamicLossScaleManager(init_loss_scale=INIT_SCALE, scale_factor=2, scale_window=1000)
               if manager_kind == "dynamic" else ms.amp.FixedLossScaleManager(INIT_SCALE, drop_overflow_update=True))
    model = ms_train.Model(net, ms_nn.MSELoss(), opt, loss_scale_manager=manager)
    assert type(model._train_network) is TrainOneStepWithLossScaleCell  # pylint: disable=protected-access
    x, y = _data(rng)
    model.train(1, _dataset(x, y, bad_first=True), dataset_sink_mode=False)
    # the inf batch was skipped, the clean one applied once
    want = _first_step("momentum", [w0, b0], _grads(w0, b0, x, y))
    np.testing.assert_allclose(net.weight.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), want[1], rtol=1e-5, atol=1e-6)
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 1
    scale = float(model._train_network.scale_sense.asnumpy())  # pylint: disable=protected-access
    assert scale == (INIT_SCALE / 2 if manager_kind == "dynamic" else INIT_SCALE)


def test_model_without_use_keeps_mindsporess_refusal_and_facade_builds_the_cell(rng):
    net = _net(rng)
    opt = ms_nn.Momentum(net.trainable_params(), 0.1, 0.9)
    manager = ms.amp.DynamicLossScaleManager(init_loss_scale=INIT_SCALE)
    with pytest.raises(ValueError, match="CPU"):
        ms_train.Model(net, ms_nn.MSELoss(), opt, loss_scale_manager=manager)
    cell = ms_optim.amp.build_train_network(net, opt, ms_nn.MSELoss(), loss_scale_manager=manager)
    assert type(cell) is TrainOneStepWithLossScaleCell
    plain = ms_optim.amp.build_train_network(net, opt, ms_nn.MSELoss())  # no manager: MindSpore's own result
    assert type(plain) is ms_nn.TrainOneStepCell
    with pytest.raises(ValueError, match="boost_level 'O1'"):  # MindSpore's boost cell has no portable version
        ms_optim.amp.build_train_network(net, opt, ms_nn.MSELoss(), boost_level="O1", loss_scale_manager=manager)
