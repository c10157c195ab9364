"""Generic tests of ms_optim's Lamb, LARS(Momentum), ASGD and thor, driven by tests/support/optim_table.py.

Per optimizer: the argument table (good sets accepted; bad sets refused with the documented type and a
message naming the argument and the value), the public signature (= MindSpore's documented one; thor's
own keyword-only extensions after it). For the first-order optimizers, on Parameters and groups: the
numeric update against the float64 reference for parameter groups/order_params, every learning-rate
form (int, float, 0-D and 1-D Tensor, list, LearningRateSchedule), weight decay as a number or a Cell
and the default beta/gamma decay filter; a learning-rate list shorter than the steps trained (thor's
per-step Tensors: tests/thor/test_thor_optimizer.py). For all four, on a net:
TrainOneStepCell (= calling the optimizer directly);
TrainOneStepWithLossScaleCell with an overflowing step (parameters and every optimizer state Parameter
bitwise untouched); Model.train with and without dataset sink (= the manual loop); and checkpoints
(save, load into fresh objects, continue: the trajectory equals the uninterrupted one exactly).
"""
import inspect
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from support.optim_table import EMPTY, OPTIMIZERS, PARAM_OPTIMIZERS, TwoDense, mindspore_signature

import ms_optim
from ms_optim.loss_scale import TrainOneStepWithLossScaleCell  # MindSpore's needs an Ascend-only op on CPU
from ms_optim.optim._base import check_schedule_length

pytestmark = pytest.mark.core  # selected by CI's version leg on the oldest MindSpore (.ci/run)

RTOL = 1e-4
ATOL = 1e-6  # float32 rounding of elements the update carries near 0 from |w| ~ 1

BAD = [(info, bad) for info in OPTIMIZERS for bad in info.bad]
GOOD = [(info, kwargs) for info in OPTIMIZERS for kwargs in info.good]


# ---- arguments and signatures -----------------------------------------------------------------------

@pytest.mark.parametrize("info,bad", BAD, ids=[f"{i.name}-{b.label}" for i, b in BAD])
def test_bad_arguments_are_refused_clearly(info, bad):
    with pytest.raises(bad.error) as caught:
        bad.build(info.target())
    message = str(caught.value)
    assert f"'{bad.name}'" in message, message
    assert bad.shows in message, message
    for words in bad.also:
        assert words in message, (words, message)


@pytest.mark.parametrize("bounds", [dict(low=0.0), dict(low=0.0, low_inclusive=False), dict(high=1.0),
                                    dict(high=1.0, high_inclusive=False), dict(low=0.0, high=1.0),
                                    dict(low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)])
def test_check_range_refuses_nan_for_every_bound_form(bounds):
    from ms_optim import _validation as V

    with pytest.raises(ValueError, match=r"'x'.*but got nan"):
        V.check_range("x", float("nan"), cls_name="C", **bounds)
    assert V.check_range("x", 0.5, cls_name="C", **bounds) == 0.5
    with pytest.raises(ValueError, match=r"'x'.*finite.*inf"):
        V.check_finite("x", float("inf"), "C")


@pytest.mark.parametrize("info,kwargs", GOOD, ids=[f"{i.name}-{sorted(k)}" for i, k in GOOD])
def test_good_arguments_are_accepted(info, kwargs):
    target = info.target()
    opt = info.make(target, **kwargs)
    assert isinstance(opt, nn.Optimizer)
    params = target if info.takes_params else target.trainable_params()
    assert [p.name for p in opt.parameters] == [p.name for p in params] == (
        ["w", "b"] if info.takes_params else ["dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"])


def _same_filter(a, b):
    names = ["dense.weight", "dense.bias", "LayerNorm.gamma", "encoder.LayerNorm.beta", "conv.weight"]
    probes = [Parameter(Tensor(np.zeros(1, np.float32)), name=n) for n in names]
    return [bool(a(p)) for p in probes] == [bool(b(p)) for p in probes]


def _matches(actual, expected):
    if len(actual) != len(expected):
        return False
    for (name, default), (want_name, want_default) in zip(actual, expected):
        if name != want_name:
            return False
        if callable(want_default) and want_default is not EMPTY:
            if not (callable(default) and _same_filter(default, want_default)):
                return False
        elif default != want_default or type(default) is not type(want_default):
            return False
    return True


@pytest.mark.parametrize("info", OPTIMIZERS, ids=repr)
def test_signature_is_mindspores_documented_one(info):
    """MindSpore's arguments in its order with its defaults, positional or keyword; after them only the
    table's keyword-only extensions (thor's)."""
    params = list(inspect.signature(info.cls).parameters.values())
    mindspores = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert _matches([(p.name, p.default) for p in mindspores], info.signature), params
    assert _matches(mindspore_signature(info.mindspore_cls), info.signature)  # the table is MindSpore 2.10's
    extensions = params[len(mindspores):]
    assert [p.name for p in extensions] == list(info.extensions)
    assert all(p.kind == p.KEYWORD_ONLY for p in extensions)


# ---- numbers against the float64 references ---------------------------------------------------------

class _StepWeightDecay(nn.Cell):
    """Dynamic weight decay: 0.01 + 0.005 * step (shape (1,), like global_step, as users write it)."""

    def construct(self, global_step):
        return ops.cast(global_step, ms.float32) * 0.005 + 0.01


class _HalvingLR(LearningRateSchedule):
    """lr = 0.2 / 2**step."""

    def construct(self, global_step):
        return 0.2 / ops.pow(2.0, ops.cast(global_step, ms.float32))


PLAIN = [("dense.weight", (5, 6)), ("dense.bias", (5,)), ("norm.gamma", (6,)), ("norm.beta", (6,))]
GROUPED = [("conv.weight", (4, 16, 2, 2)), ("dense.weight", (3, 4)), ("dense.bias", (3,)), ("bn.gamma", (4,)),
           ("head.weight", (2, 3)), ("head.bias", (2,))]
GROUPED_ORDER = ["dense.weight", "dense.bias", "conv.weight", "bn.gamma", "head.bias", "head.weight"]
STEPS = 4
LIST_LR = [0.05, 0.04, 0.03, 0.02]


def _config(name, params, info):
    """(params or groups, learning_rate, weight_decay, lr(name, step), wd(name, step), centralized names)."""
    by = {p.name: p for p in params}
    filtered = lambda n: "beta" not in n and "gamma" not in n  # noqa: E731 - MindSpore's default filter
    if name == "int_lr_float_decay":
        return (params, 1, 0.01, lambda n, s: 1.0, lambda n, s: 0.01 if filtered(n) else 0.0, ())
    if name == "tensor_list_lr_cell_decay":
        return (params, Tensor(np.array(LIST_LR, np.float32)), _StepWeightDecay(), lambda n, s: LIST_LR[s],
                lambda n, s: 0.01 + 0.005 * s if filtered(n) else 0.0, ())
    if name == "groups_order_schedule":
        first = {"params": [by["conv.weight"], by["dense.weight"]], "lr": list(LIST_LR), "weight_decay": 0.02}
        centralized = ()
        if info.centralization:
            first["grad_centralization"] = True
            centralized = ("conv.weight", "dense.weight")
        groups = [first,
                  {"params": [by["dense.bias"], by["bn.gamma"]], "lr": _HalvingLR()},  # schedule, default decay
                  {"params": [by["head.weight"]], "lr": 0.03, "weight_decay": 0.0},  # float lr, no decay
                  {"params": [by["head.bias"]]},  # the optimizer's 0-D Tensor lr and Cell decay
                  {"order_params": [by[n] for n in GROUPED_ORDER]}]
        lr_of = {"conv.weight": lambda s: LIST_LR[s], "dense.weight": lambda s: LIST_LR[s],
                 "dense.bias": lambda s: 0.2 / 2 ** s, "bn.gamma": lambda s: 0.2 / 2 ** s,
                 "head.weight": lambda s: 0.03, "head.bias": lambda s: 0.1}
        # grouped: no name filter ('gamma' decays); groups without their own decay take the Cell's
        wd_of = {"conv.weight": 0.02, "dense.weight": 0.02, "head.weight": 0.0}
        return (groups, Tensor(0.1), _StepWeightDecay(), lambda n, s: lr_of[n](s),
                lambda n, s: wd_of.get(n, 0.01 + 0.005 * s), centralized)
    raise KeyError(name)


CONFIGS = ["int_lr_float_decay", "tensor_list_lr_cell_decay", "groups_order_schedule"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("info", PARAM_OPTIMIZERS, ids=repr)
def test_update_matches_reference(info, config, mode, rng):
    spec = GROUPED if config.startswith("groups") else PLAIN
    arrays = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in spec}
    params = [Parameter(Tensor(arrays[n].copy()), name=n) for n, _ in spec]
    groups, lr, wd, lr_of, wd_of, centralized = _config(config, params, info)
    opt = info.make(groups, learning_rate=lr, weight_decay=wd, **info.hyper)
    order = [p.name for p in opt.parameters]
    if config.startswith("groups"):
        assert order == GROUPED_ORDER
    ref = info.reference([arrays[n] for n in order], order, [n in centralized for n in order], **info.hyper)
    for step in range(STEPS):
        grads = [rng.standard_normal(arrays[n].shape).astype(np.float32) for n in order]
        opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [lr_of(n, step) for n in order], [wd_of(n, step) for n in order])
        for i, p in enumerate(opt.parameters):
            np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{info.name}: {p.name} after step {step + 1}")
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == STEPS


def _state(cell):
    return {p.name: p.asnumpy().copy() for p in cell.get_parameters()}


def _assert_states_equal(before, after, what, skip=()):
    assert set(before) == set(after)
    for name, value in before.items():
        if name not in skip:
            assert np.array_equal(value, after[name], equal_nan=True), f"{what}: {name} changed"


@pytest.mark.parametrize("info", PARAM_OPTIMIZERS, ids=repr)
def test_learning_rate_list_shorter_than_training_is_a_clear_error(info, mode, rng):
    params = [Parameter(Tensor(rng.standard_normal((3, 2)).astype(np.float32)), name="w")]
    opt = info.make(params, learning_rate=[0.1, 0.05], **info.hyper)
    lr_param = opt.get_lr_parameter(params[0])  # still MindSpore's API and Parameter name
    assert lr_param.name == "learning_rate" and lr_param.shape == (2,)
    grads = (Tensor(rng.standard_normal((3, 2)).astype(np.float32)),)
    opt(grads)
    opt(grads)
    before = _state(opt)
    with pytest.raises(ValueError, match=r"'learning_rate'.*2 values.*step 3"):
        opt(grads)
    _assert_states_equal(before, _state(opt), "failed step")


class _ScheduleUser(nn.Cell):
    """A Cell running the shared check as THOR's step does (step of shape (1,), argument 'damping')."""

    def __init__(self):
        super().__init__()
        self.size_tensor = Tensor(2, ms.int32)

    def construct(self, step):
        return check_schedule_length("Thor", "damping", 2, self.size_tensor, step)


def test_one_schedule_length_check_and_message_for_every_owner(mode):
    cell = _ScheduleUser()
    assert int(cell(Tensor([1], ms.int32)).asnumpy()[0]) == 1
    with pytest.raises(ValueError, match=r"For 'Thor', the argument 'damping' gives 2 values, one per step, "
                                         r"but step 3 was requested"):
        cell(Tensor([2], ms.int32))


# ---- inside MindSpore's training machinery ----------------------------------------------------------

def _build(info, seed, lr=0.05, **extra):
    ms.set_seed(seed)
    net = TwoDense()
    hyper = {**info.hyper, **extra}
    opt = info.make_for_net(net, learning_rate=lr, weight_decay=0.01, **hyper)
    return net, opt


def _batches(n, seed=7):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32))
            for _ in range(n)]


def _train_cell(net, opt):
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    cell.set_train()
    return cell


@pytest.mark.parametrize("info", OPTIMIZERS, ids=repr)
def test_train_one_step_cell_equals_direct_calls(info, mode):
    net_a, opt_a = _build(info, 1)
    net_b, opt_b = _build(info, 1)
    cell = _train_cell(net_a, opt_a)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net_b, nn.MSELoss()), None, opt_b.parameters)
    batch = _batches(1)[0]
    losses = []
    for step in range(6):
        x, y = Tensor(batch[0]), Tensor(batch[1])
        losses.append(float(cell(x, y).asnumpy()))
        loss_b, grads = grad_fn(x, y)
        opt_b(grads)
        assert np.isclose(float(loss_b.asnumpy()), losses[-1], rtol=1e-6)
        for pa, pb in zip(opt_a.parameters, opt_b.parameters):
            np.testing.assert_allclose(pa.asnumpy(), pb.asnumpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=f"{pa.name} after step {step + 1}")
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("info", OPTIMIZERS, ids=repr)
def test_loss_scale_overflow_step_changes_nothing(info, mode):
    net, opt = _build(info, 2)
    manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=1000)
    cell = TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, scale_sense=manager.get_update_cell())
    cell.set_train()
    x, y = _batches(1)[0]
    _, overflow, scale = cell(Tensor(x), Tensor(y))
    assert not bool(overflow.asnumpy())
    scale = float(scale.asnumpy())  # (the cell returns its scale Parameter itself)
    # the network's Parameters and every Parameter of the optimizer (weights, state, lr, global_step);
    # the loss-scale update cell's own counters move on an overflow, by design
    before = {**_state(net), **_state(opt)}
    bad_x = x.copy()
    bad_x[0, 0] = np.inf  # inf activations -> inf/nan gradients
    _, overflow, new_scale = cell(Tensor(bad_x), Tensor(y))
    assert bool(overflow.asnumpy())
    assert float(new_scale.asnumpy()) == scale / 2
    after = {**_state(net), **_state(opt)}
    state_names = [n for n in after if any(n.startswith(p) for p in info.state_prefixes)]
    assert state_names, "no optimizer state found"
    _assert_states_equal(before, after, "overflow step")
    _, overflow, _ = cell(Tensor(x), Tensor(y))
    assert not bool(overflow.asnumpy())
    after_good = _state(opt)
    assert int(after_good["global_step"].reshape(-1)[0]) == 2
    for p in opt.parameters:
        assert not np.array_equal(after_good[p.name], after[p.name]), f"{p.name} did not move"


@pytest.mark.parametrize("info", OPTIMIZERS, ids=repr)
def test_model_train_with_and_without_sink_equals_manual_loop(info):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    try:
        batches = _batches(4)
        net, opt = _build(info, 3)
        cell = _train_cell(net, opt)
        for x, y in batches:
            cell(Tensor(x), Tensor(y))
        expected = _state(net)
        for sink in (False, True):
            net, opt = _build(info, 3)
            dataset = ms.dataset.GeneratorDataset(lambda: iter(batches), ["x", "y"], shuffle=False)
            model = ms.train.Model(net, loss_fn=nn.MSELoss(), optimizer=opt)
            model.train(1, dataset, dataset_sink_mode=sink)
            _assert_states_equal(expected, _state(net), f"Model.train(dataset_sink_mode={sink})")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("info", OPTIMIZERS, ids=repr)
def test_checkpoint_resume_is_exact(info, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    try:
        batches = _batches(6)
        lr = [0.05, 0.04, 0.04, 0.03, 0.03, 0.02]  # dynamic: the restored global_step picks the value
        net, opt = _build(info, 4, lr=lr)
        whole = _train_cell(net, opt)
        for x, y in batches:
            whole(Tensor(x), Tensor(y))
        expected = _state(whole)

        net, opt = _build(info, 4, lr=lr)
        first = _train_cell(net, opt)
        for x, y in batches[:3]:
            first(Tensor(x), Tensor(y))
        path = os.path.join(str(tmp_path), "step3.ckpt")
        ms.save_checkpoint(first, path)

        net, opt = _build(info, 99, lr=lr)  # fresh objects, different initial values
        second = _train_cell(net, opt)
        saved = ms.load_checkpoint(path)
        not_loaded = ms.load_param_into_net(second, saved)
        assert not list(not_loaded[0] if isinstance(not_loaded, tuple) else not_loaded)
        for p in net.trainable_params():
            for prefix in info.state_prefixes:
                assert prefix + p.name in saved, f"{prefix}{p.name} not in the checkpoint"
        assert "global_step" in saved
        for x, y in batches[3:]:
            second(Tensor(x), Tensor(y))
        _assert_states_equal(expected, _state(second), "resumed trajectory")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("name", ["Lamb", "ASGD"])
@pytest.mark.parametrize("form", ["list", "groups"])
def test_same_parameter_twice_is_named(name, form):
    """``Lamb(params=[w, w])``: the message says that ``params`` holds the same Parameter twice (MindSpore's
    says a state name ``'lamb_m.weight'`` already exists, or, for groups, a RuntimeError about repeated
    setting). LARS wraps an optimizer that has already refused such a list."""
    w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="weight")
    b = Parameter(Tensor(np.ones(3, np.float32)), name="bias")
    params = [w, b, w] if form == "list" else [{"params": [w, b]}, {"params": [w], "weight_decay": 0.1}]
    make = (lambda ps: ms_optim.nn.Lamb(ps, 0.01)) if name == "Lamb" else ms_optim.nn.ASGD
    with pytest.raises(ValueError) as info:
        make(params)
    message = str(info.value)
    assert f"For '{name}'" in message and "'params'" in message and "same Parameter 'weight' twice" in message
    make([w, b])  # each once: accepted
