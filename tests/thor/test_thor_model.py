"""ModelThor (the dataset-sink loop on every backend) and ConvertModelUtils.

The sink loop is checked against a hand-written step loop over the same batch stream (every
parameter, every epoch), against non-sink training, and for MindSpore's callback semantics. The THOR
parts check the THOR schedule through the layers' factors in every path and run the docs' example.
"""
from __future__ import annotations

import os
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, CheckpointConfig, LossMonitor, Model, ModelCheckpoint, TimeMonitor
from support import REPO
from support.model_data import BATCH, N_SAMPLES, SmallMLP, ce_loss, sample_data, sample_dataset, thor_mlp
from support.params import param_values

from ms_optim import _float16_add
from ms_optim._thor.model import ConvertModelUtils, ModelThor

if REPO not in sys.path:  # model_zoo importable
    sys.path.insert(0, REPO)

pytestmark = pytest.mark.core  # selected by CI's version leg on the oldest MindSpore (.ci/run)


def _f32(net):
    """The trainable parameters as float32 copies (runs of MindSpore compared with each other)."""
    return param_values(net, np.float32)


def _momentum_model(seed=0, **kwargs):
    ms.set_seed(seed)
    net = SmallMLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=kwargs.pop("opt_loss_scale", 1.0))
    model = ModelThor(net, ce_loss(), opt, metrics={"acc"}, **kwargs)
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
    net = SmallMLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, ce_loss()), opt)
    n_batches = N_SAMPLES // BATCH
    history, losses = [], []
    for s in range(n_steps):
        b = s % n_batches
        losses.append(float(step(Tensor(x[b * BATCH:(b + 1) * BATCH]), Tensor(y[b * BATCH:(b + 1) * BATCH])).asnumpy()))
        history.append(_f32(net))
    return history, losses


# --------------------------------------------------------------------------- sink loop (Momentum)
def test_sink_loop_equals_step_loop_and_callback_semantics(mode):
    """sink_size 3 over 5-batch epochs for 4 epochs: 12 steps streaming across dataset epochs."""
    x, y = sample_data()
    ref_params, ref_losses = _stream_reference(x, y, 12)
    net, model = _momentum_model()
    rec = _Recorder()
    model.train(4, sample_dataset(x, y), callbacks=[rec], dataset_sink_mode=True, sink_size=3)
    # step_end once per sink; cur_step_num advances by sink_size; net_outputs is the sink's last loss
    assert rec.n_begin == 4
    assert [s[:4] for s in rec.steps] == [(e, 3 * e, 3, True) for e in (1, 2, 3, 4)]
    np.testing.assert_allclose([s[4] for s in rec.steps], [ref_losses[3 * e - 1] for e in (1, 2, 3, 4)], rtol=1e-5)
    assert rec.epochs == [1, 2, 3, 4]
    for name, value in _f32(net).items():
        np.testing.assert_allclose(value, ref_params[11][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_sink_whole_dataset_equals_non_sink():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()
    results = {}
    for sink in (True, False):
        net, model = _momentum_model()
        rec = _Recorder()
        model.train(2, sample_dataset(x, y), callbacks=[rec], dataset_sink_mode=sink)  # sink_size -1
        results[sink] = (_f32(net), rec)
    sink_rec, step_rec = results[True][1], results[False][1]
    assert [s[:4] for s in sink_rec.steps] == [(1, 5, 5, True), (2, 10, 5, True)]
    assert [s[:4] for s in step_rec.steps] == [(1 + i // 5, i + 1, 5, False) for i in range(10)]
    assert sink_rec.steps[-1][4] == step_rec.steps[-1][4]
    for name, value in results[True][0].items():
        np.testing.assert_array_equal(value, results[False][0][name], err_msg=name)


def test_initial_epoch_early_stop_and_builtin_callbacks(tmp_path, capsys):
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()

    class _StopAfter(Callback):
        def on_train_epoch_end(self, run_context):
            if run_context.original_args().cur_epoch_num == 3:
                run_context.request_stop()

    net, model = _momentum_model()
    ckpt = ModelCheckpoint(prefix="thor", directory=str(tmp_path),
                           config=CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=10))
    rec = _Recorder()
    model.train(5, sample_dataset(x, y), callbacks=[rec, LossMonitor(1), TimeMonitor(), ckpt, _StopAfter()],
                dataset_sink_mode=True, sink_size=2, initial_epoch=1)
    # epochs 2 and 3 ran (initial_epoch=1), then the stop request ended training
    assert [s[:2] for s in rec.steps] == [(2, 2), (3, 4)]
    printed = capsys.readouterr().out
    assert "epoch: 2 step: 2, loss is" in printed and "epoch: 3 step: 2, loss is" in printed
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".ckpt"))
    assert files == ["thor-2_2.ckpt", "thor-3_2.ckpt"]
    saved = ms.load_checkpoint(str(tmp_path / "thor-3_2.ckpt"))
    for name, value in _f32(net).items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value, err_msg=name)
    # four steps were trained, identical to four plain steps
    ref_params, _ = _stream_reference(x, y, 4)
    for name, value in _f32(net).items():
        np.testing.assert_allclose(value, ref_params[3][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_eval_and_predict_after_sink_training():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()
    net, model = _momentum_model()
    model.train(2, sample_dataset(x, y), dataset_sink_mode=True, sink_size=4)
    acc = model.eval(sample_dataset(x, y))["acc"]
    logits = model.predict(Tensor(x)).asnumpy()
    np.testing.assert_allclose(logits, net(Tensor(x)).asnumpy(), rtol=1e-6)
    assert acc == pytest.approx(float(np.mean(np.argmax(logits, axis=1) == y)))


def test_fixed_loss_scale_is_sens_and_dynamic_loss_scale_runs_on_cpu():
    """FixedLossScaleManager(128, False): gradients arrive scaled by 128 (Momentum's loss_scale undoes it),
    same trajectory as unscaled. DynamicLossScaleManager runs on CPU (MindSpore's cell cannot) and
    skips an overflowing step."""
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()
    net_a, model_a = _momentum_model()
    model_a.train(1, sample_dataset(x, y), dataset_sink_mode=True)
    net_b, model_b = _momentum_model(loss_scale_manager=ms.FixedLossScaleManager(128.0, drop_overflow_update=False),
                                     opt_loss_scale=128.0)
    assert isinstance(model_b.train_network, nn.TrainOneStepCell)
    assert float(model_b.train_network.sens) == 128.0
    model_b.train(1, sample_dataset(x, y), dataset_sink_mode=True)
    for name, value in _f32(net_a).items():
        np.testing.assert_allclose(_f32(net_b)[name], value, rtol=1e-5, atol=1e-7, err_msg=name)

    manager = ms.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=1000)
    net_c, model_c = _momentum_model(loss_scale_manager=manager)
    model_c.train(1, sample_dataset(x, y), dataset_sink_mode=True)
    for name, value in _f32(net_a).items():  # unscaled before the optimizer: as no scaling
        np.testing.assert_allclose(_f32(net_c)[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    before = _f32(net_c)
    x_bad = x.copy()
    x_bad[:] = np.inf
    model_c.train(1, sample_dataset(x_bad, y), dataset_sink_mode=True, sink_size=1)
    for name, value in before.items():
        np.testing.assert_array_equal(_f32(net_c)[name], value, err_msg=name)
    assert float(model_c.train_network.scale_sense.asnumpy()) == 2.0 ** 9


def test_amp_levels_cast_like_model():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()
    for level, expect_fp16 in (("O0", False), ("O2", True), ("O3", True)):
        net, model = _momentum_model(amp_level=level,
                                     loss_scale_manager=ms.FixedLossScaleManager(1.0, drop_overflow_update=False))
        model.train(1, sample_dataset(x, y), dataset_sink_mode=True, sink_size=2)
        logits = model.predict(Tensor(x))
        assert (logits.dtype == ms.float16) == expect_fp16, level
        assert model.eval(sample_dataset(x, y))["acc"] >= 0.0


def test_convert_returns_model_unchanged_for_other_optimizers():
    ms.set_context(mode=ms.GRAPH_MODE)
    net = SmallMLP()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, ce_loss(), opt)
    assert ConvertModelUtils.convert_to_thor_model(model, net, ce_loss(), opt) is model
    assert ConvertModelUtils().convert_to_thor_model(model, network=net, loss_fn=ce_loss(),
                                                     optimizer=opt) is model
    assert ConvertModelUtils.convert_to_thor_model(model, net) is model


# --------------------------------------------------------------------------- THOR
def test_model_thor_adds_float16_through_float32_on_cpu():
    """On CPU, ModelThor makes graphs add float16 tensors through float32 (ms_optim._float16_add: the same bits,
    without the CPU float16 Add's per-element index arrays) before it builds its training cell."""
    _float16_add.restore_float16_add()
    net, opt = thor_mlp()
    ModelThor(net, ce_loss(), opt)
    assert _float16_add._STATE["installed"]


def _batch_a(x, step):
    """fc1's input factor A = a^T a / B of the batch trained at ``step`` (fc1 sees the raw input)."""
    b = step % (N_SAMPLES // BATCH)
    a = x[b * BATCH:(b + 1) * BATCH].astype(np.float64)
    return a.T @ a / BATCH


def test_thor_schedule_in_sink_loop_with_unaligned_sink_size(mode):
    """frequency 4, sink_size 3: THOR steps 0, 4, 8 inside sinks [0-2], [3-5], [6-8], [9-11]. fc1's factor
    at each sink end is that of the last THOR step's batch, and the parameters equal a plain
    TrainOneStepCell loop over the same 12 batches."""
    x, y = sample_data()
    ref_net, ref_opt = thor_mlp()
    step = nn.TrainOneStepCell(nn.WithLossCell(ref_net, ce_loss()), ref_opt).set_train()
    for s in range(12):
        b = s % 5
        step(Tensor(x[b * BATCH:(b + 1) * BATCH]), Tensor(y[b * BATCH:(b + 1) * BATCH]))

    net, opt = thor_mlp()
    seen = []

    class _Spy(Callback):
        def on_train_step_end(self, run_context):
            seen.append((run_context.original_args().cur_step_num, net.fc1.matrix_a_cov.asnumpy().copy(),
                         int(opt.global_step.asnumpy().reshape(-1)[0])))

    model = ConvertModelUtils.convert_to_thor_model(Model(net, ce_loss(), opt), net, loss_fn=ce_loss(),
                                                    optimizer=opt)
    assert isinstance(model, ModelThor) and model.frequency == 4
    model.train(4, sample_dataset(x, y), callbacks=[_Spy()], dataset_sink_mode=True, sink_size=3)
    assert [s[0] for s in seen] == [3, 6, 9, 12] and [s[2] for s in seen] == [3, 6, 9, 12]
    for (_, a_cov, _), last_thor_step in zip(seen, (0, 4, 8, 8)):
        np.testing.assert_allclose(a_cov, _batch_a(x, last_thor_step), rtol=1e-5, atol=1e-6)
    for name, value in _f32(ref_net).items():
        np.testing.assert_allclose(_f32(net)[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_thor_sink_equals_non_sink():
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = sample_data()
    finals = []
    for sink, sink_size, epochs in ((False, -1, 2), (True, 2, 5), (True, -1, 2)):
        net, opt = thor_mlp(frequency=3)
        model = ConvertModelUtils.convert_to_thor_model(None, net, loss_fn=ce_loss(), optimizer=opt,
                                                        metrics={"acc"})
        model.train(epochs, sample_dataset(x, y), dataset_sink_mode=sink, sink_size=sink_size)
        assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 10
        np.testing.assert_allclose(net.fc1.matrix_a_cov.asnumpy(), _batch_a(x, 9), rtol=1e-5, atol=1e-6)
        finals.append(_f32(net))
        assert 0.0 <= model.eval(sample_dataset(x, y))["acc"] <= 1.0
    for other in finals[1:]:
        for name, value in finals[0].items():
            np.testing.assert_array_equal(other[name], value, err_msg=name)


def test_convert_to_thor_model_static_and_instance_and_train_cell():
    ms.set_context(mode=ms.GRAPH_MODE)
    net, opt = thor_mlp()
    model = Model(net, ce_loss(), opt)
    a = ConvertModelUtils.convert_to_thor_model(model, net, loss_fn=ce_loss(), optimizer=opt)
    b = ConvertModelUtils().convert_to_thor_model(model, network=net, loss_fn=ce_loss(), optimizer=opt)
    assert isinstance(a, ModelThor) and isinstance(b, ModelThor) and a is not model
    train_cell = nn.TrainOneStepCell(nn.WithLossCell(net, ce_loss()), opt)
    c = ConvertModelUtils.convert_to_thor_model(Model(train_cell), train_cell)
    assert isinstance(c, ModelThor) and c.frequency == 4
    import inspect
    params = list(inspect.signature(ConvertModelUtils.convert_to_thor_model).parameters.items())
    # MindSpore's documented parameters, in order, then one keyword-only extension (frequency=,
    # which older scripts pass; it must agree with the optimizer's).
    assert [(k, v.default) for k, v in params] == [
        ("model", inspect.Parameter.empty), ("network", inspect.Parameter.empty), ("loss_fn", None),
        ("optimizer", None), ("metrics", None), ("amp_level", "O0"), ("loss_scale_manager", None),
        ("keep_batchnorm_fp32", False), ("frequency", None)]
    assert [v.kind for _, v in params][-1] == inspect.Parameter.KEYWORD_ONLY
    assert all(v.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for _, v in params[:-1])


@pytest.mark.slow
def test_docs_example_runs_on_cpu(capsys):
    """MindSpore's ConvertModelUtils example, imports switched to ms_optim, LeNet5 on digits; then eval.
    The same run without sink gives identical parameters."""
    from mindspore.train import Model as MsModel  # noqa: F401  (the docs write ms.train.Model)

    from model_zoo.lenet.dataset import create_dataset as make_ds
    from model_zoo.lenet.dataset import load_digits_32
    from model_zoo.lenet.lenet import LeNet5
    from ms_optim.nn import thor
    from ms_optim.train_thor import ConvertModelUtils as DocsConvert

    ms.set_context(mode=ms.GRAPH_MODE)
    x_tr, y_tr, x_te, y_te = load_digits_32()
    finals = []
    for sink in (True, False):
        ms.set_seed(0)
        net = LeNet5()
        dataset = make_ds(x_tr[:256], y_tr[:256], batch_size=32, shuffle=False)
        temp = Tensor([4e-4, 1e-4, 1e-5, 1e-5], ms.float32)
        lr, damping = temp, temp
        opt = thor(net, lr, damping, momentum=0.9, weight_decay=1e-4, loss_scale=128, batch_size=32, frequency=4)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')
        loss_scale = ms.FixedLossScaleManager(128, drop_overflow_update=False)
        model = ms.train.Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, metrics={'acc'},
                               amp_level="O2", keep_batchnorm_fp32=False)
        model = DocsConvert.convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                  loss_scale_manager=loss_scale, metrics={'acc'}, amp_level="O2",
                                                  keep_batchnorm_fp32=False)
        loss_cb = LossMonitor()
        if sink:
            model.train(1, dataset, callbacks=[loss_cb], sink_size=4, dataset_sink_mode=True)
            assert "epoch: 1 step: 4, loss is" in capsys.readouterr().out
        else:
            model.train(1, make_ds(x_tr[:128], y_tr[:128], batch_size=32, shuffle=False), callbacks=[loss_cb])
        assert isinstance(model, ModelThor)
        assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 4
        result = model.eval(make_ds(x_te, y_te, batch_size=32, shuffle=False))
        assert set(result) == {"acc"} and 0.0 <= result["acc"] <= 1.0
        params = {p.name: p.asnumpy() for p in net.trainable_params()}
        assert all(np.isfinite(v).all() for v in params.values())
        assert np.abs(net.fc1.matrix_a_cov.asnumpy()).sum() > 0  # step 0 was a THOR step
        finals.append(params)
    for name, value in finals[0].items():
        np.testing.assert_array_equal(finals[1][name], value, err_msg=name)


def test_thor_dynamic_loss_scale_equals_unscaled(mode):
    """DynamicLossScaleManager(2**10, factor 2, window 2) through ModelThor: the scale doubles after
    steps 1, 3, 5, so the THOR steps 2 and 4 (frequency 2) run with scales 2048 and 4096. The layers'
    G carry the scale squared; the cell feeds the scale it used into ``factor_loss_scale``, so the
    parameters and every inverse equal those of the same run without loss scaling."""
    x, y = sample_data()
    runs = []
    for manager in (None, ms.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=2)):
        net, opt = thor_mlp(frequency=2)
        model = ConvertModelUtils.convert_to_thor_model(None, net, loss_fn=ce_loss(), optimizer=opt,
                                                        loss_scale_manager=manager)
        model.train(2, sample_dataset(x, y), dataset_sink_mode=True, sink_size=3)
        assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 6
        runs.append((net, opt, model))
    (net_a, opt_a, _), (net_b, opt_b, model_b) = runs
    assert float(model_b.train_network.scale_sense.asnumpy()) == 2.0 ** 13    # changed 3 times
    assert float(opt_b.factor_loss_scale.asnumpy()) == 2.0 ** 12             # the scale step 5 used
    assert float(opt_a.factor_loss_scale.asnumpy()) == 1.0
    # G of the last THOR step (4) was stored under scale 4096
    np.testing.assert_allclose(net_b.fc2.matrix_g_cov.asnumpy() / 2.0 ** 24, net_a.fc2.matrix_g_cov.asnumpy(),
                               rtol=1e-4, atol=1e-12)
    for name, value in _f32(net_a).items():
        np.testing.assert_allclose(_f32(net_b)[name], value, rtol=1e-4, atol=1e-7, err_msg=name)
    for inv_a, inv_b in zip(list(opt_a.matrix_a_inv) + list(opt_a.matrix_g_inv),
                            list(opt_b.matrix_a_inv) + list(opt_b.matrix_g_inv)):
        np.testing.assert_allclose(inv_b.asnumpy(), inv_a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=inv_a.name)
