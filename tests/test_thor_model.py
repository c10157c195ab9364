"""ModelThor (the dataset-sink loop on every backend) and ConvertModelUtils.

The sink loop is checked against a hand-written step loop over the same batch stream (every
parameter, every epoch), against non-sink training, and for MindSpore's callback semantics. The THOR
parts check the THOR schedule through the layers' factors in every path and run the docs' example.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn
from mindspore.train import Callback, LossMonitor, Model, ModelCheckpoint, CheckpointConfig, TimeMonitor

from ms_optim.thor.model import ConvertModelUtils, ModelThor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

N_SAMPLES, BATCH, IN, OUT = 20, 4, 6, 3          # 5 batches per dataset epoch


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_SAMPLES, IN)).astype(np.float32)
    y = rng.integers(0, OUT, size=(N_SAMPLES,)).astype(np.int32)
    return x, y


def _dataset(x, y, batch=BATCH):
    data = ds.NumpySlicesDataset({"x": x, "y": y.reshape(-1, 1)}, shuffle=False)
    data = data.map(lambda v: v.reshape(()), input_columns="y")
    return data.batch(batch, drop_remainder=True)


class _MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(IN, 5, weight_init="normal")
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(5, OUT, weight_init="normal")

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _loss():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _params(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def _momentum_model(seed=0, **kwargs):
    ms.set_seed(seed)
    net = _MLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=kwargs.pop("opt_loss_scale", 1.0))
    model = ModelThor(net, _loss(), opt, metrics={"acc"}, **kwargs)
    return net, model


class _Recorder(Callback):
    """Records what MindSpore's callbacks see at step_end/epoch_end."""

    def __init__(self):
        super().__init__()
        self.steps, self.epochs, self.n_begin = [], [], 0

    def on_train_step_begin(self, run_context):
        self.n_begin += 1

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        out = p.net_outputs[0] if isinstance(p.net_outputs, (tuple, list)) else p.net_outputs
        self.steps.append((p.cur_epoch_num, p.cur_step_num, p.batch_num, bool(p.dataset_sink_mode),
                           float(out.asnumpy())))

    def on_train_epoch_end(self, run_context):
        self.epochs.append(run_context.original_args().cur_epoch_num)


def _stream_reference(x, y, n_steps, seed=0):
    """Plain TrainOneStepCell over the batch stream (dataset epochs concatenated); params after each step."""
    ms.set_seed(seed)
    net = _MLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, _loss()), opt)
    n_batches = N_SAMPLES // BATCH
    history, losses = [], []
    for s in range(n_steps):
        b = s % n_batches
        losses.append(float(step(Tensor(x[b * BATCH:(b + 1) * BATCH]), Tensor(y[b * BATCH:(b + 1) * BATCH])).asnumpy()))
        history.append(_params(net))
    return history, losses


# --------------------------------------------------------------------------- sink loop (Momentum)
def test_sink_loop_equals_step_loop_and_callback_semantics(mode):
    """sink_size 3 over 5-batch epochs for 4 epochs: 12 steps streaming across dataset epochs."""
    x, y = _data()
    ref_params, ref_losses = _stream_reference(x, y, 12)
    net, model = _momentum_model()
    rec = _Recorder()
    model.train(4, _dataset(x, y), callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    # step_end once per sink; cur_step_num advances by sink_size; net_outputs is the sink's last loss
    assert rec.n_begin == 4
    assert [s[:4] for s in rec.steps] == [(e, 3 * e, 3, True) for e in (1, 2, 3, 4)]
    np.testing.assert_allclose([s[4] for s in rec.steps], [ref_losses[3 * e - 1] for e in (1, 2, 3, 4)], rtol=1e-5)
    assert rec.epochs == [1, 2, 3, 4]
    for name, value in _params(net).items():
        np.testing.assert_allclose(value, ref_params[11][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_sink_whole_dataset_equals_non_sink():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = _data()
    results = {}
    for sink in (True, False):
        net, model = _momentum_model()
        rec = _Recorder()
        model.train(2, _dataset(x, y), callbacks=[rec], dataset_sink_mode=sink)  # sink_size -1
        results[sink] = (_params(net), rec)
    sink_rec, step_rec = results[True][1], results[False][1]
    assert [s[:4] for s in sink_rec.steps] == [(1, 5, 5, True), (2, 10, 5, True)]
    assert [s[:4] for s in step_rec.steps] == [(1 + i // 5, i + 1, 5, False) for i in range(10)]
    assert sink_rec.steps[-1][4] == step_rec.steps[-1][4]
    for name, value in results[True][0].items():
        np.testing.assert_array_equal(value, results[False][0][name], err_msg=name)


def test_initial_epoch_early_stop_and_builtin_callbacks(tmp_path, capsys):
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = _data()

    class _StopAfter(Callback):
        def on_train_epoch_end(self, run_context):
            if run_context.original_args().cur_epoch_num == 3:
                run_context.request_stop()

    net, model = _momentum_model()
    ckpt = ModelCheckpoint(prefix="thor", directory=str(tmp_path),
                           config=CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=10))
    rec = _Recorder()
    model.train(5, _dataset(x, y), callbacks=[rec, LossMonitor(1), TimeMonitor(), ckpt, _StopAfter()],
                dataset_sink_mode=True, sink_size=2, initial_epoch=1)
    # epochs 2 and 3 ran (initial_epoch=1), then the stop request ended training
    assert [s[:2] for s in rec.steps] == [(2, 2), (3, 4)]
    printed = capsys.readouterr().out
    assert "epoch: 2 step: 2, loss is" in printed and "epoch: 3 step: 2, loss is" in printed
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".ckpt"))
    assert files == ["thor-2_2.ckpt", "thor-3_2.ckpt"]
    saved = ms.load_checkpoint(str(tmp_path / "thor-3_2.ckpt"))
    for name, value in _params(net).items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value, err_msg=name)
    # four steps were trained, identical to four plain steps
    ref_params, _ = _stream_reference(x, y, 4)
    for name, value in _params(net).items():
        np.testing.assert_allclose(value, ref_params[3][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_eval_and_predict_after_sink_training():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = _data()
    net, model = _momentum_model()
    model.train(2, _dataset(x, y), dataset_sink_mode=True, sink_size=4)
    acc = model.eval(_dataset(x, y))["acc"]
    logits = model.predict(Tensor(x)).asnumpy()
    np.testing.assert_allclose(logits, net(Tensor(x)).asnumpy(), rtol=1e-6)
    assert acc == pytest.approx(float(np.mean(np.argmax(logits, axis=1) == y)))


def test_fixed_loss_scale_is_sens_and_dynamic_loss_scale_runs_on_cpu():
    """FixedLossScaleManager(128, False): gradients arrive scaled by 128 (Momentum's loss_scale undoes it),
    same trajectory as unscaled. DynamicLossScaleManager runs on CPU (MindSpore's cell cannot) and
    skips an overflowing step."""
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = _data()
    net_a, model_a = _momentum_model()
    model_a.train(1, _dataset(x, y), dataset_sink_mode=True)
    net_b, model_b = _momentum_model(loss_scale_manager=ms.FixedLossScaleManager(128.0, drop_overflow_update=False),
                                     opt_loss_scale=128.0)
    assert isinstance(model_b.train_network, nn.TrainOneStepCell)
    assert float(model_b.train_network.sens) == 128.0
    model_b.train(1, _dataset(x, y), dataset_sink_mode=True)
    for name, value in _params(net_a).items():
        np.testing.assert_allclose(_params(net_b)[name], value, rtol=1e-5, atol=1e-7, err_msg=name)

    manager = ms.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=1000)
    net_c, model_c = _momentum_model(loss_scale_manager=manager)
    model_c.train(1, _dataset(x, y), dataset_sink_mode=True)
    for name, value in _params(net_a).items():  # unscaled before the optimizer: same as no scaling
        np.testing.assert_allclose(_params(net_c)[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    before = _params(net_c)
    x_bad = x.copy()
    x_bad[:] = np.inf
    model_c.train(1, _dataset(x_bad, y), dataset_sink_mode=True, sink_size=1)
    for name, value in before.items():
        np.testing.assert_array_equal(_params(net_c)[name], value, err_msg=name)
    assert float(model_c.train_network.scale_sense.asnumpy()) == 2.0 ** 9


def test_amp_levels_cast_like_model():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = _data()
    for level, expect_fp16 in (("O0", False), ("O2", True), ("O3", True)):
        net, model = _momentum_model(amp_level=level,
                                     loss_scale_manager=ms.FixedLossScaleManager(1.0, drop_overflow_update=False))
        model.train(1, _dataset(x, y), dataset_sink_mode=True, sink_size=2)
        logits = model.predict(Tensor(x))
        assert (logits.dtype == ms.float16) == expect_fp16, level
        assert model.eval(_dataset(x, y))["acc"] >= 0.0


def test_convert_returns_model_unchanged_for_other_optimizers():
    ms.set_context(mode=ms.GRAPH_MODE)
    net = _MLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, _loss(), opt)
    assert ConvertModelUtils.convert_to_thor_model(model, net, _loss(), opt) is model
    assert ConvertModelUtils().convert_to_thor_model(model, network=net, loss_fn=_loss(), optimizer=opt) is model
    assert ConvertModelUtils.convert_to_thor_model(model, net) is model
