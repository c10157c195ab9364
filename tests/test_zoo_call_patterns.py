"""The ways MindSpore's model zoo (mindspore-ai/models) calls Lamb, LARS and THOR, reproduced on tiny nets.

Each test rebuilds one calling pattern with code written here (not the zoo's), trains a few steps on
CPU and checks numbers:

* BERT pretraining (official/nlp/Bert/run_pretrain.py): ``Lamb`` on three groups (decayed weights with
  their weight decay, the rest without a ``weight_decay`` key, ``order_params``), beta1 0.99 / eps 1e-8,
  a ``LearningRateSchedule`` Cell (warm-up then polynomial decay), inside the user's own loss-scale
  step cell (dynamic scale, per-tensor norm clipping, skip on overflow), driven by
  ``Model(net_with_grads)``. Checked step by step against the float64 Lamb reference.
* GPT (official/nlp/GPT/train.py): the same with default betas, an explicit ``weight_decay: 0.0`` group
  and a warm-up-then-decay schedule Cell.
* GNMT (research/nlp/gnmt_v2/train.py): ``Lamb(params, learning_rate=<1-D Tensor>, eps=1e-6)`` in a
  loss-scale step cell with the update cell of a ``DynamicLossScaleManager``; checked the same way.
* res2net (research/cv/res2net/train.py): ``LARS(Momentum(groups, lr_tensor, momentum, loss_scale=1024),
  epsilon=0.0, coefficient=0.001, lars_filter=<no beta/gamma/bias>)`` in ``Model(net, loss_fn,
  optimizer, metrics)``; checked against the float64 LARS + Momentum reference.
* many parameter tensors (res2net-50 has about 320): a grouped LARS/Lamb compiles in graph mode and
  matches the reference.
* BERT-THOR (official/nlp/Bert_thor/run_pretrain.py): ``thor(net_with_loss, lr, damping, momentum,
  weight_decay, loss_scale, batch_size, decay_filter=..., split_indices=None, enable_clip_grad=True,
  frequency=...)`` with an ``nn.Embedding`` (becomes ``EmbeddingThor``), the user's ``TrainOneStepCell``
  with ``sens=loss_scale``, ``Model(net_with_grads)`` converted by ``ConvertModelUtils`` and trained in
  sink mode; checked: the embedding's A factor equals the token counts of the THOR step's batch, every
  parameter moved, the loss fell.

MindSpore's own ``nn.TrainOneStepWithLossScaleCell`` cannot run on CPU (its overflow test uses an
Ascend-only op), so the user's loss-scale cells here derive from ``ms_optim.nn.TrainOneStepWithLossScaleCell``
as a CPU user's would.
"""
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, ops
from mindspore import dtype as mstype
from mindspore import nn as ms_nn
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.train import Callback, Model
from mindspore.train.loss_scale_manager import DynamicLossScaleManager
from reference.lamb_ref import LambReference
from reference.lars_ref import MomentumReference, lars_gradient

from ms_optim import nn
from ms_optim.train_thor import ConvertModelUtils

VOCAB, HIDDEN, SEQ, BATCH = 12, 8, 5, 4
CLIP = 1.0


# ---------------------------------------------------------------------------------------------- nets, data
class TinyEncoder(ms_nn.Cell):
    """Embedding -> LayerNorm -> Dense+tanh -> Dense to the vocabulary: a token-level masked-LM toy."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = ms_nn.Embedding(VOCAB, HIDDEN)
        self.layernorm = ms_nn.LayerNorm((HIDDEN,))
        self.dense = ms_nn.Dense(HIDDEN, HIDDEN, activation="tanh")
        self.output = ms_nn.Dense(HIDDEN, VOCAB)

    def construct(self, ids):
        return self.output(self.dense(self.layernorm(self.word_embeddings(ids))))


class TokenLoss(ms_nn.Cell):
    """Mean cross-entropy over every token (the network with its loss, as the zoo's *WithLoss cells)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.xent = ms_nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels):
        logits = self.net(ids)
        return self.xent(ops.reshape(logits, (-1, VOCAB)), ops.reshape(labels, (-1,)))


def _token_batches(batches, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(batches, BATCH, SEQ)).astype(np.int32)
    return ids, ((ids + 1) % VOCAB).astype(np.int32)  # a learnable next-id mapping


def _dataset(*columns, names):
    rows = [tuple(np.asarray(c[i]) for c in columns) for i in range(len(columns[0]))]
    return ds.GeneratorDataset(rows, column_names=list(names), shuffle=False)


def _zoo_decay_filter(param):
    """The zoo's rule: decay everything but LayerNorm parameters and biases."""
    return "layernorm" not in param.name.lower() and "bias" not in param.name.lower()


class GradRecorder(Callback):
    """Before every step, records the unscaled gradient of ``loss_net`` at the current weights."""

    def __init__(self, loss_net, batches):
        super().__init__()
        self.weights = loss_net.trainable_params()
        self.grad_fn = ms.value_and_grad(loss_net, None, self.weights)
        self.batches, self.steps, self.grads, self.losses = batches, 0, [], []

    def on_train_step_begin(self, run_context):
        loss, grads = self.grad_fn(*(Tensor(b[self.steps]) for b in self.batches))
        self.losses.append(float(loss.asnumpy()))
        self.grads.append([g.asnumpy().astype(np.float64) for g in grads])
        self.steps += 1


# ---------------------------------------------------------------------------------------------- loss-scale cell
_clip_and_unscale = ops.MultitypeFuncGraph("_clip_and_unscale")


@_clip_and_unscale.register("Tensor", "Tensor")
def _tensor_clip_and_unscale(scale, grad):
    grad = grad / ops.cast(scale, ops.dtype(grad))
    return ops.clip_by_norm(grad, CLIP)


class UserLossScaleStep(nn.TrainOneStepWithLossScaleCell):
    """A zoo-style step cell: seed the backward pass with the dynamic scale, unscale and clip each
    gradient to norm ``CLIP``, check overflow, update the scale, step only without overflow."""

    def construct(self, ids, labels):
        loss = self.network(ids, labels)
        scale = self.scale_sense * 1.0
        status, scale = self.start_overflow_check(loss, scale)
        grads = self.grad(self.network, self.weights)(ids, labels, ops.cast(scale, mstype.float32))
        grads = self.grad_reducer(grads)
        grads = self.hyper_map(ops.partial(_clip_and_unscale, scale), grads)
        overflow = self.get_overflow_status(status, grads)
        overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scale


def _clip(g):
    return g * (CLIP / max(float(np.linalg.norm(g)), CLIP))


# ---------------------------------------------------------------------------------------------- schedules
class WarmupThenPoly(LearningRateSchedule):
    """Linear warm-up (MindSpore's WarmUpLR) for ``warmup`` steps, then polynomial decay."""

    def __init__(self, peak, end, warmup, decay_steps, power):
        super().__init__()
        self.warmup_lr = ms_nn.WarmUpLR(peak, warmup)
        self.decay_lr = ms_nn.PolynomialDecayLR(peak, end, decay_steps, power)
        self.warmup = Tensor(float(warmup), mstype.float32)

    def construct(self, global_step):
        in_warmup = ops.cast(ops.cast(global_step, mstype.float32) < self.warmup, mstype.float32)
        return in_warmup * self.warmup_lr(global_step) + (1.0 - in_warmup) * self.decay_lr(global_step)


def _warmup_then_poly_np(step, peak, end, warmup, decay_steps, power):
    if step < warmup:
        return peak * step / warmup
    return (peak - end) * (1.0 - min(step, decay_steps) / decay_steps) ** power + end


def _check_lamb_against_reference(net, loss_net, recorder, opt_kwargs, lrs, wds):
    """Replays the recorded gradients (clipped) through the float64 Lamb and compares the weights."""
    params = loss_net.trainable_params()
    ref = LambReference(recorder.initial, **opt_kwargs)
    for step, grads in enumerate(recorder.grads):
        ref.step([_clip(g) for g in grads], [lrs[step]] * len(grads), wds)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=1e-4, atol=1e-6, err_msg=p.name)
        assert not np.allclose(p.asnumpy(), recorder.initial[i]), f"{p.name} did not move"


# ---------------------------------------------------------------------------------------------- Lamb
@pytest.mark.parametrize("style", ["bert", "gpt"])
def test_lamb_decay_groups_schedule_cell_in_users_loss_scale_cell(mode, style):
    ms.set_seed(1)
    steps = 5
    net = TinyEncoder()
    loss_net = TokenLoss(net)
    params = loss_net.trainable_params()
    decay = [p for p in params if _zoo_decay_filter(p)]
    other = [p for p in params if not _zoo_decay_filter(p)]
    assert {p.name for p in other} >= {"net.layernorm.gamma", "net.dense.bias"}
    if style == "bert":
        schedule = (0.05, 0.0, 2, steps, 2.0)
        groups = [{"params": decay, "weight_decay": 0.01}, {"params": other}, {"order_params": params}]
        opt_kwargs = dict(beta1=0.99, beta2=0.999, eps=1e-8)
    else:
        schedule = (0.05, 1e-4, 1, steps, 1.0)
        groups = [{"params": decay, "weight_decay": 1e-2}, {"params": other, "weight_decay": 0.0},
                  {"order_params": params}]
        opt_kwargs = {}
    optimizer = nn.Lamb(groups, learning_rate=WarmupThenPoly(*schedule), **opt_kwargs)
    manager = ms_nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 16, scale_factor=2, scale_window=1000)
    net_with_grads = UserLossScaleStep(loss_net, optimizer, manager)

    ids, labels = _token_batches(steps)
    recorder = GradRecorder(loss_net, (ids, labels))
    recorder.initial = [p.asnumpy().astype(np.float64) for p in params]
    Model(net_with_grads).train(1, _dataset(ids, labels, names=["ids", "labels"]), callbacks=[recorder],
                                dataset_sink_mode=False)
    assert recorder.steps == steps
    lrs = [_warmup_then_poly_np(t, *schedule) for t in range(steps)]
    decayed = {id(p) for p in decay}
    wds = [(0.01 if style == "bert" else 1e-2) if id(p) in decayed else 0.0 for p in params]
    _check_lamb_against_reference(net, loss_net, recorder, opt_kwargs, lrs, wds)
    assert all(np.isfinite(recorder.losses)) and recorder.losses[-1] < recorder.losses[0]


def test_lamb_tensor_lr_in_loss_scale_manager_cell(mode):
    """GNMT: Lamb(params, learning_rate=1-D Tensor, eps=1e-6), DynamicLossScaleManager's update cell."""
    ms.set_seed(2)
    steps = 4
    net = TinyEncoder()
    loss_net = TokenLoss(net)
    params = loss_net.trainable_params()
    lr_values = np.array([0.02, 0.03, 0.01, 0.005], np.float32)
    optimizer = nn.Lamb(loss_net.trainable_params(), learning_rate=Tensor(lr_values), eps=1e-6)
    manager = DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=1000)
    net_with_grads = UserLossScaleStep(loss_net, optimizer, manager.get_update_cell())
    net_with_grads.set_train(True)

    ids, labels = _token_batches(steps, seed=3)
    recorder = GradRecorder(loss_net, (ids, labels))
    recorder.initial = [p.asnumpy().astype(np.float64) for p in params]
    Model(net_with_grads).train(1, _dataset(ids, labels, names=["ids", "labels"]), callbacks=[recorder],
                                dataset_sink_mode=False)
    assert recorder.steps == steps
    _check_lamb_against_reference(net, loss_net, recorder, dict(eps=1e-6), [float(v) for v in lr_values],
                                  [0.0] * len(params))


def test_lamb_step_skipped_on_overflow_in_users_loss_scale_cell(mode):
    """An overflowing step (scale too large for float32) leaves weights and moments, halves the scale."""
    net = TinyEncoder()
    loss_net = TokenLoss(net)
    optimizer = nn.Lamb(loss_net.trainable_params(), learning_rate=0.01)
    manager = ms_nn.DynamicLossScaleUpdateCell(loss_scale_value=3.0e38, scale_factor=2, scale_window=1000)
    step = UserLossScaleStep(loss_net, optimizer, manager)
    before = [p.asnumpy().copy() for p in loss_net.trainable_params()]
    ids, labels = _token_batches(1)
    loss, overflow, _ = step(Tensor(ids[0]), Tensor(labels[0]))
    assert bool(overflow.asnumpy()) and np.isfinite(float(loss.asnumpy()))
    assert float(step.scale_sense.asnumpy()) == pytest.approx(1.5e38, rel=1e-6)
    for p, b in zip(loss_net.trainable_params(), before):
        np.testing.assert_array_equal(p.asnumpy(), b, err_msg=p.name)
    assert all(not m.asnumpy().any() for m in optimizer.moments1)


# ---------------------------------------------------------------------------------------------- LARS
class TinyConvNet(ms_nn.Cell):
    """Conv(bias) -> BatchNorm -> ReLU -> Dense(bias): weights, beta/gamma and biases, as a CNN has."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = ms_nn.Conv2d(1, 3, 3, pad_mode="valid", has_bias=True)
        self.bn = ms_nn.BatchNorm2d(3, use_batch_statistics=False)  # eval statistics: a deterministic forward
        self.relu = ms_nn.ReLU()
        self.flatten = ms_nn.Flatten()
        self.fc = ms_nn.Dense(3 * 4 * 4, classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.bn(self.conv(x)))))


def test_lars_around_grouped_momentum_with_loss_scale_in_model(mode):
    """res2net: LARS(Momentum(groups, lr Tensor, 0.9, loss_scale=1024), epsilon=0.0, coefficient=0.001)."""
    ms.set_seed(3)
    steps, loss_scale, wd, coefficient = 4, 1024.0, 1e-4, 0.001
    net = TinyConvNet()
    params = net.trainable_params()

    def kept(p):
        return "beta" not in p.name and "gamma" not in p.name and "bias" not in p.name

    groups = [{"params": [p for p in params if kept(p)], "weight_decay": wd},
              {"params": [p for p in params if not kept(p)]}, {"order_params": params}]
    lr_values = np.array([0.5, 0.4, 0.3, 0.2], np.float32)
    inner = ms_nn.Momentum(groups, Tensor(lr_values), 0.9, loss_scale=loss_scale)
    opt = nn.LARS(inner, epsilon=0.0, coefficient=coefficient, lars_filter=kept)
    loss_fn = ms_nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn=loss_fn, optimizer=opt, metrics={"acc"})

    rng = np.random.default_rng(4)
    x = rng.standard_normal((steps, BATCH, 1, 6, 6)).astype(np.float32)
    y = x.reshape(steps, BATCH, -1)[..., :3].argmax(-1).astype(np.int32)
    recorder = GradRecorder(ms_nn.WithLossCell(net, loss_fn), (x, y))
    initial = [p.asnumpy().astype(np.float64) for p in params]
    model.train(1, _dataset(x, y, names=["x", "y"]), callbacks=[recorder], dataset_sink_mode=False)
    assert recorder.steps == steps

    ref = MomentumReference(initial, 0.9)
    for step, grads in enumerate(recorder.grads):
        lr = float(lr_values[step])
        scaled = [g / loss_scale for g in grads]  # Model on CPU does not scale the loss; Momentum divides
        new = [lars_gradient(w, g, lr, wd, coefficient, 0.0, False) if kept(p) else g
               for p, w, g in zip(params, ref.w, scaled)]
        ref.step(new, [lr] * len(params), [0.0] * len(params))
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=1e-4, atol=1e-6, err_msg=p.name)
        assert not np.allclose(p.asnumpy(), initial[i]), f"{p.name} did not move"


@pytest.mark.parametrize("kind", ["lars", "lamb"])
def test_hundreds_of_parameter_tensors_with_decay_groups(kind):
    """res2net-50 has about 320 parameter tensors: the per-parameter weight decay of a grouped optimizer
    must compile for that many in graph mode (MindSpore's call-depth limit is 1000), and the step match
    the float64 reference."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        rng = np.random.default_rng(6)
        initial = [rng.standard_normal((4, 4) if i % 2 == 0 else (4,)) for i in range(320)]
        params = [ms.Parameter(Tensor(w, mstype.float32), name=f"layer{i // 2}.{'weight' if i % 2 == 0 else 'bias'}")
                  for i, w in enumerate(initial)]
        initial = [p.asnumpy().astype(np.float64) for p in params]
        grads = [rng.standard_normal(w.shape) for w in initial]
        decayed = [p for p in params if "bias" not in p.name]
        groups = [{"params": decayed, "weight_decay": 0.01}, {"params": [p for p in params if "bias" in p.name]},
                  {"order_params": params}]
        if kind == "lars":
            opt = nn.LARS(ms_nn.Momentum(groups, 0.1, 0.9), coefficient=0.01)
        else:
            opt = nn.Lamb(groups, learning_rate=0.01)
        opt(tuple(Tensor(g, mstype.float32) for g in grads))
        grads = [Tensor(g, mstype.float32).asnumpy().astype(np.float64) for g in grads]
        wds = [0.01 if "bias" not in p.name else 0.0 for p in params]
        if kind == "lars":
            ref = MomentumReference(initial, 0.9)
            ref.step([lars_gradient(w, g, 0.1, wd, 0.01, 1e-5, False) if "bias" not in p.name else g
                      for p, w, g, wd in zip(params, initial, grads, wds)], [0.1] * len(params), [0.0] * len(params))
        else:
            ref = LambReference(initial)
            ref.step(grads, [0.01] * len(params), wds)
        for i, p in enumerate(params):
            np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=1e-4, atol=1e-6, err_msg=p.name)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


# ---------------------------------------------------------------------------------------------- THOR
class UserTrainOneStep(ms_nn.TrainOneStepCell):
    """BERT-THOR's plain step cell: the backward pass seeded with ``sens`` (THOR's loss scale)."""

    def construct(self, ids, labels):
        loss = self.network(ids, labels)
        grads = self.grad(self.network, self.weights)(ids, labels, ops.fill(loss.dtype, loss.shape, self.sens))
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.optimizer(grads))


class LossLog(Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        out = run_context.original_args().net_outputs
        self.losses.append(float((out[0] if isinstance(out, (tuple, list)) else out).asnumpy()))


def test_thor_embedding_thor_via_model_of_users_step_cell_in_sink_mode(mode):
    ms.set_seed(4)
    frequency, sink_size, epochs, loss_scale = 3, 4, 3, 128.0
    steps = sink_size * epochs
    net = TinyEncoder()
    loss_net = TokenLoss(net)
    lr = Tensor(np.full(steps, 0.05, np.float32))
    damping = Tensor(np.full(steps, 0.03, np.float32))
    optimizer = nn.thor(loss_net, lr, damping, 0.9, 1e-4, loss_scale, BATCH, decay_filter=_zoo_decay_filter,
                        split_indices=None, enable_clip_grad=True, frequency=frequency)
    assert type(net.word_embeddings).__name__ == "EmbeddingThor"
    assert type(net.word_embeddings).__module__.startswith("ms_optim.")
    assert type(net.dense).__name__ == "DenseThor"
    net_with_grads = UserTrainOneStep(loss_net, optimizer, sens=loss_scale)
    model = ConvertModelUtils().convert_to_thor_model(Model(net_with_grads), network=net_with_grads,
                                                      optimizer=optimizer)
    assert type(model).__module__.startswith("ms_optim.")

    ids, labels = _token_batches(steps, seed=5)
    data = _dataset(ids[:sink_size], labels[:sink_size], names=["ids", "labels"])  # one pass = one sink
    before = {p.name: p.asnumpy().copy() for p in loss_net.trainable_params()}
    log = LossLog()
    model.train(epochs, data, callbacks=[log], dataset_sink_mode=True, sink_size=sink_size)

    # The last THOR step is the last step whose index is a multiple of `frequency`: its batch gives A.
    last_thor = max(t for t in range(steps) if t % frequency == 0)
    batch_ids = ids[last_thor % sink_size].reshape(-1)
    counts = np.bincount(batch_ids, minlength=VOCAB) / batch_ids.size
    np.testing.assert_allclose(net.word_embeddings.matrix_a_cov.asnumpy(), counts, rtol=1e-6, atol=1e-7)
    for name, value in before.items():
        now = dict((p.name, p.asnumpy()) for p in loss_net.trainable_params())[name]
        assert np.all(np.isfinite(now)) and not np.array_equal(now, value), f"{name} did not move"
    assert len(log.losses) == epochs and all(np.isfinite(log.losses))
    assert log.losses[-1] < log.losses[0]
