"""Every calling style found in public MindSpore THOR/Lamb/LARS/ASGD scripts works with ms_optim.

One test per style; each trains a tiny net a few steps on CPU and asserts that every trainable
parameter changed and stayed finite (the update rules themselves are held to NumPy references in the
optimizers' own test modules). Styles covered:

* ``ConvertModelUtils().convert_to_thor_model(model=..., network=..., ...)`` (instance) and
  ``ConvertModelUtils.convert_to_thor_model(...)`` (class);
* top-level names: ``ms_optim.thor``, ``ms_optim.ConvertModelUtils``, ``ms_optim.Lamb``, ...;
* ``frequency=`` passed to ``convert_to_thor_model`` (older scripts): accepted when it agrees with the
  optimizer, ValueError naming both values when it does not;
* BERT-THOR: ``Model(net_with_grads)`` around the user's own ``TrainOneStepCell``, then
  ``convert_to_thor_model(model, network=net_with_grads, optimizer=optimizer)``, sink and non-sink;
* ``amp_level`` O0/O2/O3, ``keep_batchnorm_fp32``, ``eval_network``, a custom ``Metric``,
  Fixed/Dynamic loss-scale managers, lr and damping as ``Tensor(numpy array of epochs*steps values)``;
* ``nn.thor(net, lr, Tensor(damping), momentum, weight_decay, loss_scale, batch_size,
  split_indices=[...], frequency=...)`` positionally, as the ResNet trainer calls it.
"""
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, ops
from mindspore import nn as ms_nn
from mindspore.train import Metric, Model
from support.params import param_values

import ms_optim
from ms_optim import nn
from ms_optim.train_thor import ConvertModelUtils

BATCH = 8
FEATURES = 6
CLASSES = 3


# ---------------------------------------------------------------------------------------------- helpers
class MLP(ms_nn.Cell):
    """Dense-ReLU-Dense-ReLU-Dense with biases: three THOR layers."""

    def __init__(self, hidden=8):
        super().__init__()
        self.fc1 = ms_nn.Dense(FEATURES, hidden)
        self.fc2 = ms_nn.Dense(hidden, hidden)
        self.fc3 = ms_nn.Dense(hidden, CLASSES)
        self.relu = ms_nn.ReLU()

    def construct(self, x):
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


class ConvBN(ms_nn.Cell):
    """Conv2d-BatchNorm-ReLU-Dense on 1x6x6 inputs (for amp and keep_batchnorm_fp32)."""

    def __init__(self):
        super().__init__()
        self.conv = ms_nn.Conv2d(1, 4, 3, pad_mode="valid")
        self.bn = ms_nn.BatchNorm2d(4)
        self.relu = ms_nn.ReLU()
        self.flatten = ms_nn.Flatten()
        self.fc = ms_nn.Dense(4 * 4 * 4, CLASSES)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.bn(self.conv(x)))))


def _dataset(batches=4, image=False, seed=0):
    rng = np.random.default_rng(seed)
    n = batches * BATCH
    x = rng.standard_normal((n, 1, 6, 6) if image else (n, FEATURES)).astype(np.float32)
    y = (x.reshape(n, -1)[:, :3].argmax(axis=1)).astype(np.int32)
    rows = [(x[i], np.asarray(y[i], np.int32)) for i in range(n)]  # arrays, not numpy scalars (numpy 2)
    return ds.GeneratorDataset(rows, column_names=["x", "y"], shuffle=False).batch(BATCH)


def _loss():
    return ms_nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _schedule(value, steps):
    return Tensor(np.full(steps, value, np.float32))


def _thor(net, steps=4, frequency=2, **kwargs):
    return nn.thor(net, _schedule(0.05, steps), _schedule(0.03, steps), 0.9, frequency=frequency,
                   batch_size=BATCH, **kwargs)


def _assert_trained(net, before):
    after = param_values(net, np.float32)
    assert set(after) == set(before)
    for name, value in after.items():
        assert np.all(np.isfinite(value)), f"{name} is not finite"
        assert not np.array_equal(value, before[name]), f"{name} did not change"


def _train_thor_model(make_model, net, steps=4, sink=True, image=False, epochs=1):
    before = param_values(net, np.float32)
    model = make_model()
    assert type(model).__module__ == "ms_optim._thor.model"
    model.train(epochs, _dataset(steps, image=image), dataset_sink_mode=sink, sink_size=steps if sink else -1)
    _assert_trained(net, before)
    return model


# ---------------------------------------------------------------------------------------------- styles
def test_convert_instance_style_with_keywords():
    ms.set_seed(1)
    net, loss = MLP(), _loss()
    opt = _thor(net)
    model = Model(net, loss_fn=loss, optimizer=opt, metrics={"acc"})
    _train_thor_model(lambda: ConvertModelUtils().convert_to_thor_model(
        model=model, network=net, loss_fn=loss, optimizer=opt, metrics={"acc"}), net)


def test_convert_class_style_positional(mode):
    ms.set_seed(2)
    net, loss = MLP(), _loss()
    opt = _thor(net)
    model = Model(net, loss, opt)
    _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(model, net, loss, opt), net, sink=False)


def test_top_level_names():
    """``import ms_optim`` alone gives every public name, identical to the facades'."""
    for name in ("thor", "Lamb", "LARS", "ASGD", "DenseThor", "Conv2dThor", "EmbeddingThor"):
        assert getattr(ms_optim, name) is getattr(ms_optim.nn, name)
    for name in ("ConvertModelUtils", "ConvertNetUtils", "ModelThor"):
        assert getattr(ms_optim, name) is getattr(ms_optim.train_thor, name)
    ms.set_seed(3)
    net, loss = MLP(), _loss()
    opt = ms_optim.thor(net, _schedule(0.05, 3), _schedule(0.03, 3), 0.9, batch_size=BATCH, frequency=2)
    _train_thor_model(lambda: ms_optim.ConvertModelUtils.convert_to_thor_model(
        Model(net, loss, opt), network=net, loss_fn=loss, optimizer=opt), net, steps=3)
    for make in (lambda p: ms_optim.Lamb(p, learning_rate=0.01),
                 lambda p: ms_optim.LARS(ms_nn.Momentum(p, 0.05, 0.9), epsilon=0.0, coefficient=0.001),
                 lambda p: ms_optim.ASGD(p, learning_rate=0.05)):
        net = MLP()
        before = param_values(net, np.float32)
        Model(net, loss, make(net.trainable_params())).train(1, _dataset(2), dataset_sink_mode=False)
        _assert_trained(net, before)


def test_frequency_keyword_accepted_when_it_agrees():
    ms.set_seed(4)
    net, loss = MLP(), _loss()
    opt = _thor(net, frequency=3)
    model = Model(net, loss, opt)
    _train_thor_model(lambda: ConvertModelUtils().convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt, frequency=3), net)


def test_frequency_keyword_disagreeing_names_both_values():
    net, loss = MLP(), _loss()
    opt = _thor(net, frequency=3)
    model = Model(net, loss, opt)
    with pytest.raises(ValueError, match=r"(?s)frequency.*(5.*3|3.*5)"):
        ConvertModelUtils.convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt, frequency=5)


class UserTrainOneStepCell(ms_nn.TrainOneStepCell):
    """The user's own step cell, as in MindSpore's BERT-THOR trainer: clip by global norm, then step."""

    def construct(self, x, y):
        loss = self.network(x, y)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(x, y, sens)
        grads = ops.clip_by_global_norm(grads, 1.0)
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.optimizer(grads))


@pytest.mark.parametrize("sink", [True, False], ids=["sink", "nonsink"])
def test_bert_thor_style_user_step_cell(sink):
    ms.set_seed(5)
    net = MLP()
    net_with_loss = ms_nn.WithLossCell(net, _loss())
    optimizer = _thor(net_with_loss)
    net_with_grads = UserTrainOneStepCell(net_with_loss, optimizer)
    model = Model(net_with_grads)
    thor_model = _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net_with_grads, optimizer=optimizer), net, sink=sink)
    assert thor_model._train_network is net_with_grads  # the user's own step cell is what trained


def _cpu_legal_manager(amp_level):
    """What MindSpore's own ``Model`` accepts on CPU: it refuses a dynamic loss scale there, and "O2"
    defaults to one, so a CPU script gives O2 a FixedLossScaleManager(drop_overflow_update=False)."""
    return ms.FixedLossScaleManager(1.0, drop_overflow_update=False) if amp_level == "O2" else None


@pytest.mark.parametrize("amp_level", ["O0", "O2", "O3"])
def test_amp_levels(amp_level):
    """The THOR model gets ``amp_level`` alone: for O2 it then uses O2's default dynamic loss scale,
    which ms_optim's THOR model runs on CPU too."""
    ms.set_seed(6)
    net, loss = ConvBN(), _loss()
    opt = _thor(net)
    model = Model(net, loss, opt, amp_level=amp_level, loss_scale_manager=_cpu_legal_manager(amp_level))
    _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt, amp_level=amp_level), net, image=True)


@pytest.mark.parametrize("keep", [True, False], ids=["keep_bn_fp32", "bn_fp16"])
def test_keep_batchnorm_fp32(keep):
    ms.set_seed(7)
    net, loss = ConvBN(), _loss()
    opt = _thor(net)
    model = Model(net, loss, opt, amp_level="O2", keep_batchnorm_fp32=keep, loss_scale_manager=_cpu_legal_manager("O2"))
    _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt, amp_level="O2", keep_batchnorm_fp32=keep),
        net, image=True)
    assert all(p.dtype == ms.float32 for p in net.trainable_params())  # O2 keeps float32 parameters
    # The setting reached the precision pass: a float32 BatchNorm is wrapped to hand float16 onwards.
    assert (type(net.bn).__name__ == "_OutputTo16") is keep


class ArgmaxEval(ms_nn.Cell):
    """A user's eval network: (loss, logits, label), as MindSpore's WithEvalCell returns."""

    def __init__(self, net, loss):
        super().__init__(auto_prefix=False)
        self.net, self.loss = net, loss

    def construct(self, x, y):
        logits = self.net(x)
        return self.loss(logits, y), logits, y


class MeanLabel(Metric):
    """A custom Metric: mean predicted class index (depends on the trained weights)."""

    def clear(self):
        self.total, self.count = 0.0, 0

    def update(self, *inputs):
        logits = self._convert_data(inputs[0])
        self.total += float(np.argmax(logits, axis=1).sum())
        self.count += logits.shape[0]

    def eval(self):
        return self.total / max(self.count, 1)


def test_eval_network_and_custom_metric():
    ms.set_seed(8)
    net, loss = MLP(), _loss()
    opt = _thor(net)
    eval_net = ArgmaxEval(net, loss)
    metrics = {"acc": ms.train.Accuracy(), "mean_label": MeanLabel()}
    model = Model(net, loss, opt, metrics=metrics, eval_network=eval_net, eval_indexes=[0, 1, 2])
    thor_model = _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt, metrics=metrics), net)
    result = thor_model.eval(_dataset(2), dataset_sink_mode=False)
    logits = np.concatenate([net(Tensor(x)).asnumpy() for x, _ in _dataset(2).create_tuple_iterator(output_numpy=True)])
    labels = np.concatenate([y for _, y in _dataset(2).create_tuple_iterator(output_numpy=True)])
    assert result["mean_label"] == pytest.approx(np.argmax(logits, 1).mean())
    assert result["acc"] == pytest.approx((np.argmax(logits, 1) == labels).mean())


@pytest.mark.parametrize("kind", ["fixed", "dynamic"])
def test_loss_scale_managers(kind):
    ms.set_seed(9)
    net, loss = MLP(), _loss()
    opt = _thor(net, loss_scale=128.0) if kind == "fixed" else _thor(net)
    manager = (ms.FixedLossScaleManager(128.0, drop_overflow_update=False) if kind == "fixed"
               else ms.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=2))
    # MindSpore's own Model refuses a dynamic manager on CPU (GPU/Ascend scripts pass it here too);
    # the THOR model takes it either way.
    model = Model(net, loss, opt, loss_scale_manager=manager if kind == "fixed" else None)
    _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt, loss_scale_manager=manager), net)


def test_lr_and_damping_as_tensor_of_epochs_times_steps():
    """The ResNet trainer's inputs: numpy arrays with one value per step of every epoch."""
    epochs, steps = 2, 3
    total = epochs * steps
    lr = Tensor(np.linspace(0.05, 0.01, total).astype(np.float32))
    damping = Tensor((0.03 * 0.87 ** (np.arange(total) / 10.0)).astype(np.float32))
    ms.set_seed(10)
    net, loss = MLP(), _loss()
    opt = nn.thor(net, lr, damping, 0.9, 1e-4, 1.0, BATCH, frequency=2)
    model = Model(net, loss, opt)
    _train_thor_model(lambda: ConvertModelUtils.convert_to_thor_model(
        model, network=net, loss_fn=loss, optimizer=opt), net, steps=steps, epochs=epochs)
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == total


class DeepMLP(ms_nn.Cell):
    """Six Dense layers (six THOR layers) for split_indices."""

    def __init__(self):
        super().__init__()
        sizes = [FEATURES, 8, 8, 8, 8, 8, CLASSES]
        self.layers = ms_nn.SequentialCell(
            *[cell for i in range(6) for cell in ([ms_nn.Dense(sizes[i], sizes[i + 1])]
                                                   + ([ms_nn.ReLU()] if i < 5 else []))])

    def construct(self, x):
        return self.layers(x)


def test_thor_positional_as_resnet_trainer():
    """``nn.thor(net, lr, Tensor(damping), momentum, weight_decay, loss_scale, batch_size,
    split_indices=..., frequency=...)`` then ``ConvertModelUtils().convert_to_thor_model(...)``,
    as model zoo ResNet's train.py does (its split_indices [26, 53] need ResNet-50's 54 THOR layers;
    here valid indices for six)."""
    steps = 4
    ms.set_seed(11)
    net, loss = DeepMLP(), _loss()
    damping = np.full(steps, 0.03, np.float32)
    opt = nn.thor(net, _schedule(0.05, steps), Tensor(damping), 0.9, 5e-4, 128.0, BATCH,
                  split_indices=[2, 5], frequency=2)
    manager = ms.FixedLossScaleManager(128.0, drop_overflow_update=False)
    model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=manager, metrics={"acc"},
                  amp_level="O2", keep_batchnorm_fp32=False)
    _train_thor_model(lambda: ConvertModelUtils().convert_to_thor_model(
        model=model, network=net, loss_fn=loss, optimizer=opt, loss_scale_manager=manager, metrics={"acc"},
        amp_level="O2", keep_batchnorm_fp32=False), net)
