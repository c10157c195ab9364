"""``thor(..., damping="adaptive")`` against its float64 oracle (``reference.thor_adaptive_ref``): the
initial damping, the inversions a changed damping causes, the quadratic model's q, the reduction ratio and
the Levenberg-Marquardt update, step by step, in both modes and through every training cell that runs the
extra forward pass; the refusals."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.amp import DynamicLossScaleManager
from reference.thor_adaptive_ref import REJECTED_GROWTH, AdaptiveThorReference
from reference.thor_adaptive_ref import unresolved as reference_unresolved
from reference.thor_ref import MLPRef
from support.nets import MLP, labelled_batches
from support.params import param_values
from support.thor_runs import RTOL, compare, init_params, mlp_batches

from ms_optim import nn as ms_nn
from ms_optim import thor
from ms_optim._thor.step.damping import FAILED_RATIO, unresolved

LR = 0.05
STEPS = 8
SETTINGS = dict(frequency=3, adapt_every=2)


def _loss_net(net):
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


# the same oracle through other parts of THOR: the per-layer strategy (the trace rule at 0 re-inverts every
# layer on every refresh), whole-matrix inverses, KL clipping (the rule measures the clipped update)
CASES = {
    "blocked": (dict(), dict()),
    "trace_rule_at_zero": (dict(trace_thresholds=0.0), dict()),
    "full": (dict(inverse="full"), dict(block_size=None)),
    "kl_clip": (dict(kl_clip=1e-3), dict(kl_clip=1e-3)),
}


def _setup(rng, lr=LR, case="blocked", **kwargs):
    net = MLP()
    init_params(net, rng)
    settings = dict(SETTINGS, **kwargs)
    opt_kwargs, ref_kwargs = CASES[case]
    ref = AdaptiveThorReference(MLPRef(), param_values(net), [lr], 0.9, batch_size=16,
                                frequency=settings["frequency"], adapt_every=settings["adapt_every"],
                                **ref_kwargs)
    opt = thor(net, Tensor(lr, ms.float32), "adaptive", 0.9, batch_size=16, **settings, **opt_kwargs)
    return net, opt, ref


def _check_step(net, opt, ref, step, loss, records=True):
    """The loss, every parameter and the damping against the oracle; with ``records`` the numbers an adaptation
    step records too."""
    rule = opt.damping_rule
    np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL,
                               err_msg=f"loss at step {step}")
    compare(net, ref, step)
    np.testing.assert_allclose(float(rule.value.asnumpy()), ref.dampings[-1], rtol=1e-5,
                               err_msg=f"damping after step {step}")
    if records and ref.ratios and ref.ratios[-1][0] == step:
        np.testing.assert_allclose(float(rule.predicted.asnumpy()), ref.predicted[-1][1], rtol=RTOL,
                                   err_msg=f"q of step {step}")
        np.testing.assert_allclose(float(rule.loss_change.asnumpy()), ref.changes[-1][1], rtol=1e-2,
                                   atol=1e-5, err_msg=f"L1 - L0 of step {step}")
        np.testing.assert_allclose(float(rule.ratio.asnumpy()), ref.ratios[-1][1], rtol=1e-2, atol=1e-4,
                                   err_msg=f"reduction ratio of step {step}")


def _exercised(ref):
    """The run must have moved the damping both ways or at least once, and re-inverted off the THOR steps."""
    assert len(set(ref.dampings)) > 1, ref.dampings
    assert any(t % SETTINGS["frequency"] for t in ref.inversion_steps), ref.inversion_steps


@pytest.mark.parametrize("case", sorted(CASES))
def test_adaptive_damping_matches_reference(mode, path, rng, case):
    net, opt, ref = _setup(rng, case=case)
    if case == "trace_rule_at_zero":
        assert opt.strategy == "per_layer"
    cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    for step, (x, y) in enumerate(mlp_batches(rng, STEPS)):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        _check_step(net, opt, ref, step, loss)
    _exercised(ref)
    if case == "kl_clip":
        assert min(ref.kl_nu) < 1.0  # the clip was active


def test_adaptive_damping_under_dynamic_loss_scale(mode, rng):
    """The loss-scale cell: the same unscaled trajectory (G carries the scale squared, divided out)."""
    net, opt, ref = _setup(rng)
    manager = DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=3)
    cell = ms_nn.TrainOneStepWithLossScaleCell(_loss_net(net), opt, scale_sense=manager.get_update_cell())
    cell.set_train()
    for step, (x, y) in enumerate(mlp_batches(rng, STEPS)):
        loss, overflow, _ = cell(Tensor(x), Tensor(y))
        assert not bool(overflow.asnumpy())
        ref.step(x, y)
        _check_step(net, opt, ref, step, loss)
    assert float(cell.scale_sense.asnumpy()) > 2.0 ** 10  # the scale changed between THOR steps
    _exercised(ref)


def test_a_step_that_raised_the_loss_is_taken_back(mode, rng):
    """A step that made the loss on its batch worse is not kept: the parameters are as before it, the momentum
    accumulation is 0, the damping is at least ``REJECTED_GROWTH`` (2) times the one the step was taken with,
    and a second step taken back in a row doubles that growth (4); here as in the oracle, on steps that adapt
    (``adapt_every=1``: the first step's ratio is recorded too; the second's loss after it overflows float32,
    recorded as 0) and on ones that do not."""
    for adapt_every in (1, 2):
        net, opt, ref = _setup(rng, lr=30.0, adapt_every=adapt_every)
        before = param_values(net)
        cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
        rule = opt.damping_rule
        growth = REJECTED_GROWTH
        for step, (x, y) in enumerate(mlp_batches(rng, 2)):
            taken_with = float(rule.value.asnumpy()) if step else None
            loss = cell(Tensor(x), Tensor(y))
            ref.step(x, y)
            assert ref.rejections == list(range(step + 1)) and int(rule.rejected_steps.asnumpy()) == step + 1
            for name, value in param_values(net).items():
                np.testing.assert_allclose(value, before[name], rtol=1e-6, atol=1e-6, err_msg=name)
            for moment in opt.moments:
                assert not np.any(moment.asnumpy()), moment.name
            _check_step(net, opt, ref, step, loss, records=step == 0)
            taken_with = taken_with or float(rule.inverted.asnumpy())  # the first step's initial damping
            assert float(rule.value.asnumpy()) >= growth * taken_with * (1 - 1e-6), (step, rule.value, taken_with)
            growth *= 2.0
            assert float(rule.growth.asnumpy()) == growth
            recorded = float(rule.loss_change.asnumpy())
            if step == 0:
                assert (recorded > 0) if adapt_every == 1 else recorded == 0.0  # recorded on adaptation steps


def test_a_kept_step_resets_the_damping_growth(mode, rng):
    """After steps taken back, the first step kept brings the growth back to ``REJECTED_GROWTH``: one failure
    after a run of good steps raises the damping twofold, not by what an earlier run of failures reached."""
    net, opt, ref = _setup(rng, lr=0.05, adapt_every=2)
    rule = opt.damping_rule
    rule.growth.set_data(Tensor(np.float32(16.0)))
    cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    (x, y), = mlp_batches(rng, 1)
    cell(Tensor(x), Tensor(y))
    assert int(rule.rejected_steps.asnumpy()) == 0
    assert float(rule.growth.asnumpy()) == REJECTED_GROWTH

def _teacher_data(rng, batches: int = 4, batch: int = 16):
    """A task an MLP can learn (labels from a fixed linear teacher): all its samples, and its batches."""
    x = rng.standard_normal((batches * batch, 20)).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((20, 10)), axis=1).astype(np.int32)
    return (x, y), [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]


def test_damping_keeps_a_learning_rate_far_too_large_finite_and_learning(mode):
    """At a constant learning rate that sends the fixed damping's run to a non-finite loss within steps, the
    adaptive damping takes back the steps that fail and keeps lowering the loss, step for step as the oracle.
    (A step here may raise a float32 loss past its range, which the float64 oracle still measures: both take
    the step back, so the parameters and the damping agree, not the recorded change.)"""
    lr = 1.0
    oracle_steps = 10
    (x_all, y_all), batches = _teacher_data(np.random.default_rng(3))
    batches = batches * 5
    fixed = MLP()
    init_params(fixed, np.random.default_rng(5))
    fixed_cell = ms_nn.TrainOneStepCell(_loss_net(fixed), thor(fixed, Tensor(lr), Tensor(0.03), 0.9,
                                                               batch_size=16, frequency=3)).set_train()
    fixed_losses = [float(fixed_cell(Tensor(x), Tensor(y)).asnumpy()) for x, y in batches]
    assert not np.all(np.isfinite(fixed_losses)), fixed_losses  # the rate is too large for a fixed damping
    net, opt, ref = _setup(np.random.default_rng(5), lr=lr)
    start = float(_loss_net(net)(Tensor(x_all), Tensor(y_all)).asnumpy())
    cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    losses = []
    for step, (x, y) in enumerate(batches):
        loss = cell(Tensor(x), Tensor(y))
        losses.append(float(loss.asnumpy()))
        if step < oracle_steps:  # beyond, float32 and float64 part ways at this rate
            ref.step(x, y)
            _check_step(net, opt, ref, step, loss, records=False)
        if step == oracle_steps - 1:
            assert ref.rejections and int(opt.damping_rule.rejected_steps.asnumpy()) == len(
                ref.rejections), ref.rejections
    assert np.all(np.isfinite(losses)), losses
    end = float(_loss_net(net)(Tensor(x_all), Tensor(y_all)).asnumpy())
    assert end < 0.1 * start, (start, end, losses)  # it keeps learning
    for name, parameter in opt.parameters_and_names():  # every piece of state a checkpoint holds
        assert np.all(np.isfinite(parameter.asnumpy())), name


class _Fenced(nn.Cell):
    """The net's loss plus ``0 * log(eps - |fc1.weight - its start|^2)``: 0 with a zero gradient while the weight
    stays within ``sqrt(eps)`` of where it started, NaN once a step moves it further. A step's own loss is then
    finite and the loss after it is not."""

    def __init__(self, net, eps=1e-12):
        super().__init__()
        self.net = net
        self.loss_net = _loss_net(net)
        self.start = Tensor(net.fc1.weight.asnumpy())
        self.eps = Tensor(np.float32(eps))

    def construct(self, x, y):
        moved = ops.reduce_sum(ops.square(self.net.fc1.weight - self.start))
        return self.loss_net(x, y) + 0.0 * ops.log(self.eps - moved)


@pytest.mark.parametrize("learning_rate", ["adaptive", 0.05])
def test_a_non_finite_loss_after_a_step_leaves_every_state_finite(mode, rng, learning_rate):
    """The loss after the step (the adaptive learning rate's trial, or the scheduled step) is NaN: the step is
    taken back, the damping (or the adaptive step's calibration) rises, and every Parameter of the net and the
    optimizer, the records of the damping rule included, is finite: a checkpoint guard that scans them lets the
    run go on."""
    net = MLP()
    init_params(net, rng)
    lr = learning_rate if learning_rate == "adaptive" else Tensor(np.float32(learning_rate))
    opt = thor(net, lr, "adaptive", 0.9, batch_size=16, frequency=3, adapt_every=1)
    cell = ms_nn.TrainOneStepCell(_Fenced(net), opt).set_train()
    before = param_values(net)
    (x, y), = mlp_batches(rng, 1)
    loss = cell(Tensor(x), Tensor(y))
    assert np.isfinite(float(loss.asnumpy()))
    rule = opt.damping_rule
    inverted = float(rule.inverted.asnumpy())  # the damping the step was taken with
    if learning_rate == "adaptive":  # the trial's failure: its ratio raises the damping, kappa grows tenfold
        assert float(rule.value.asnumpy()) > inverted and float(opt.step_rule.calibration.asnumpy()) >= 10.0
    else:
        assert float(rule.value.asnumpy()) >= REJECTED_GROWTH * inverted * (1 - 1e-6)
    assert float(rule.ratio.asnumpy()) == FAILED_RATIO and float(rule.loss_change.asnumpy()) == 0.0
    for name, value in param_values(net).items():  # taken back
        np.testing.assert_allclose(value, before[name], rtol=1e-6, atol=1e-6, err_msg=name)
    for name, parameter in list(opt.parameters_and_names()) + list(net.parameters_and_names()):
        assert np.all(np.isfinite(parameter.asnumpy())), name


def test_adapt_records_only_finite_numbers(mode):
    """A ratio, change or prediction that is no number (a trial or a step whose loss was not finite) is
    recorded as FAILED_RATIO and 0: a checkpoint holds no NaN or inf, so a guard that scans every
    Parameter lets it through; the damping rises."""
    opt = thor(MLP(), Tensor(0.1), "adaptive", 0.9)
    rule = opt.damping_rule
    before = float(rule.value.asnumpy())
    nan, inf = Tensor(np.float32("nan")), Tensor(np.float32("inf"))
    rule.adapt(nan, inf, nan, Tensor(False), Tensor(True), Tensor(True))
    recorded = [float(p.asnumpy()) for p in (rule.ratio, rule.loss_change, rule.predicted)]
    assert recorded == [FAILED_RATIO, 0.0, 0.0], recorded
    assert float(rule.value.asnumpy()) >= REJECTED_GROWTH * before * (1 - 1e-6)
    assert int(rule.rejected_steps.asnumpy()) == 1
    raised = float(rule.value.asnumpy())  # a second failure in a row: the growth has doubled
    rule.adapt(nan, inf, nan, Tensor(False), Tensor(True), Tensor(True))
    assert float(rule.value.asnumpy()) >= 2 * REJECTED_GROWTH * raised * (1 - 1e-6)


def test_damping_stays_after_a_step_below_the_loss_resolution(mode, rng):
    """At learning rate 0 the step moves nothing: q = 0 and L1 - L0 = 0, whose ratio 0/0 is no number. That is
    no failure of the model (nothing was predicted or measured): the damping stays, here as in the oracle."""
    net, opt, ref = _setup(rng, lr=0.0, adapt_every=1)
    cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    (x, y), = mlp_batches(rng, 1)
    rule = opt.damping_rule
    for step in range(3):
        cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        assert float(rule.predicted.asnumpy()) == 0.0 and float(rule.loss_change.asnumpy()) == 0.0
        assert float(rule.ratio.asnumpy()) == FAILED_RATIO  # recorded as not a number, as before
        assert float(rule.value.asnumpy()) == float(rule.inverted.asnumpy()), step  # the damping it stepped with
    np.testing.assert_allclose(float(rule.value.asnumpy()), ref.dampings[0], rtol=1e-5)
    assert ref.dampings == [ref.dampings[0]] * 3, ref.dampings


# (change, predicted, loss before, loss after, unresolved): the resolution is 2**-16 of the larger |loss|
UNRESOLVED = [
    (0.0, 0.0, 0.5, 0.5, True),
    (2.0 ** -18, -2.0 ** -18, 1.0, 1.0 + 2.0 ** -18, True),
    (2.0 ** -14, 0.0, 1.0, 1.0 + 2.0 ** -14, False),  # the loss moved measurably
    (0.0, -2.0 ** -14, 1.0, 1.0, False),  # the model predicted a measurable change
    (0.0, 0.0, -4.0, -4.0, True),  # |loss|: a loss may be negative
    (0.0, float("nan"), 1.0, 1.0, False),  # no number is a failure, not noise
    (float("inf"), 0.0, 1.0, float("inf"), False),
]


@pytest.mark.parametrize("change, predicted, before, after, expected", UNRESOLVED)
def test_unresolved_is_a_change_below_float32_resolution_of_the_loss(mode, change, predicted, before, after,
                                                                      expected):
    values = [Tensor(np.float32(v)) for v in (change, predicted, before, after)]
    assert bool(unresolved(*values).asnumpy()) is expected
    assert reference_unresolved(change, predicted, before, after) is expected


def test_model_thor_sink_matches_reference(mode, rng):
    from ms_optim.train_thor import ConvertModelUtils

    net, opt, ref = _setup(rng)
    batches = mlp_batches(rng, STEPS)
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.train.Model(net, loss_fn=loss, optimizer=opt)
    model = ConvertModelUtils.convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
    model.train(2, labelled_batches(x, y, 16), dataset_sink_mode=True, sink_size=STEPS // 2)
    for bx, by in batches:
        ref.step(bx, by)
    compare(net, ref, STEPS - 1)
    np.testing.assert_allclose(float(opt.damping_rule.value.asnumpy()), ref.dampings[-1], rtol=1e-5)
    _exercised(ref)


def test_mindspore_cell_is_refused_before_any_update(mode, rng):
    """MindSpore's own TrainOneStepCell never runs the extra forward pass: the first step is refused before
    anything is written (the parameters, the factors the backward pass would store, the optimizer's state),
    and the same optimizer then trains in ms_optim's cell."""
    net, opt, _ = _setup(rng)
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    state = {name: p.asnumpy().copy() for name, p in opt.parameters_and_names()}
    cell = nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    (x, y), = mlp_batches(rng, 1)
    with pytest.raises(RuntimeError, match="damping='adaptive' needs the loss after each step"):
        cell(Tensor(x), Tensor(y))
    for p in net.get_parameters():  # the weights and the THOR layers' factors
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)
    for name, p in opt.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), state[name], err_msg=name)
    assert any("matrix_a" in name for name in before)
    loss = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()(Tensor(x), Tensor(y))
    assert np.isfinite(float(loss.asnumpy())) and int(opt.global_step.asnumpy()[0]) == 1


BAD = [
    (dict(damping="adaptiv"), ValueError, "'damping' must be a Tensor or 'adaptive', but got 'adaptiv'"),
    (dict(damping=0.03), TypeError, "'damping' must be a Tensor"),
    (dict(adapt_every=0), ValueError, "'adapt_every'"),
    (dict(adapt_every=2.0), TypeError, "'adapt_every'"),
    (dict(adapt_every=2 ** 31), ValueError, "'adapt_every'"),
    (dict(damping=Tensor(0.03), adapt_every=3), ValueError,
     "'adapt_every' is read only with damping='adaptive'"),
    (dict(damping=Tensor(0.03), damping_bounds=(1e-3, 1.0)), ValueError, "'damping_bounds' is read only"),
    (dict(damping_bounds=(0.0, 1.0)), ValueError, r"'damping_bounds' must be \(low, high\).*\(0.0, 1.0\)"),
    (dict(damping_bounds=(2.0, 1.0)), ValueError, r"\(2.0, 1.0\)"),
    (dict(damping_bounds=(1e-3, float("inf"))), ValueError, "'damping_bounds'"),
    (dict(damping_bounds=(1e-3, 1e39)), ValueError, "'damping_bounds'"),
    (dict(damping_bounds=1.0), TypeError, "'damping_bounds' must be None or a pair"),
    (dict(damping_bounds=(1e-3,)), TypeError, "'damping_bounds'"),
    (dict(damping_bounds=("a", 1.0)), TypeError, "'damping_bounds'"),
    (dict(use_nesterov=True), ValueError, "use_nesterov=False.*but got use_nesterov=True"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_adaptive_arguments_are_refused(kwargs, error, match):
    net = MLP()
    call = dict(damping="adaptive", momentum=0.9)
    call.update(kwargs)
    damping = call.pop("damping")
    momentum = call.pop("momentum")
    with pytest.raises(error, match=match):
        thor(net, Tensor(0.1), damping, momentum, **call)
    assert all(type(cell).__name__ != "DenseThor" for _, cell in net.cells_and_names())  # nothing converted


def test_defaults():
    opt = thor(MLP(), Tensor(0.1), "adaptive", 0.9)
    rule = opt.damping_rule
    assert (opt.config.adapt_every, opt.config.damping_bounds) == (5, (1e-8, 1e4))
    assert rule.adapt_every == 5 and opt.damping is rule.value
    scheduled = thor(MLP(), Tensor(0.1), Tensor(0.03), 0.9)
    assert scheduled.config.damping_mode == "scheduled" and not scheduled.measures_loss


def _model_run(use_ms_optim: bool, steps: int = 4):
    """Adaptive lr and damping stepped ``steps`` times by MindSpore's ``Model`` (plain ``train``), under
    ``ms_optim.use()`` or not; returns (parameters, optimizer)."""
    import ms_optim

    net = MLP()
    init_params(net, np.random.default_rng(21))
    (x, y), = mlp_batches(np.random.default_rng(22), 1, batch=64)
    opt = thor(net, "adaptive", "adaptive", 0.9, batch_size=64, frequency=3, adapt_every=2)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    data = labelled_batches(np.tile(x, (steps, 1)), np.tile(y, steps), 64)
    if use_ms_optim:
        with ms_optim.use(verbose=False):
            ms.train.Model(net, loss_fn=loss, optimizer=opt).train(1, data, dataset_sink_mode=False)
    else:
        ms.train.Model(net, loss_fn=loss, optimizer=opt).train(1, data, dataset_sink_mode=False)
    return param_values(net), opt


def test_mindspore_model_under_use_steps_adaptive_thor_as_ms_optim_cell(mode):
    """Under ``ms_optim.use()`` MindSpore's ``Model`` builds ms_optim's TrainOneStepCell for an adaptive THOR
    (the trial's forward pass): the same parameters as stepping that cell by hand; without ``use()`` the
    step is refused."""
    got, opt = _model_run(True)
    net = MLP()
    init_params(net, np.random.default_rng(21))
    (x, y), = mlp_batches(np.random.default_rng(22), 1, batch=64)
    mine = thor(net, "adaptive", "adaptive", 0.9, batch_size=64, frequency=3, adapt_every=2)
    cell = ms_nn.TrainOneStepCell(_loss_net(net), mine).set_train()
    for _ in range(4):
        cell(Tensor(x), Tensor(y))
    for name, value in param_values(net).items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert float(opt.step_rule.calibration.asnumpy()) != 1.0  # the trial was measured
    with pytest.raises(RuntimeError, match="which the training cell computes"):
        _model_run(False)


def _adaptive_cell(seed: int = 31):
    net = MLP()
    init_params(net, np.random.default_rng(seed))
    opt = thor(net, "adaptive", "adaptive", 0.9, batch_size=64, frequency=3, adapt_every=2)
    return net, opt, ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()


def test_checkpoint_without_initial_damping_keeps_the_resumed_damping_as_floor(mode, tmp_path):
    """A checkpoint holding no ``thor_initial_damping`` (the floor of the calibrated damping rule): the
    resumed run takes the damping it resumed with as its start, on its first adaptation step, and the damping
    never falls below it (not to the lower bound)."""
    batches = [mlp_batches(np.random.default_rng(60 + i), 1, batch=64)[0] for i in range(9)]
    _, _, first_cell = _adaptive_cell()
    for x, y in batches[:3]:
        first_cell(Tensor(x), Tensor(y))
    path = str(tmp_path / "adaptive.ckpt")
    ms.save_checkpoint(first_cell, path)
    saved = ms.load_checkpoint(path)
    resumed_with = float(saved["thor_damping"].asnumpy())
    del saved["thor_initial_damping"]
    _, resumed_opt, resumed_cell = _adaptive_cell(seed=99)
    not_loaded, _ = ms.load_param_into_net(resumed_cell, saved)
    assert not_loaded == ["thor_initial_damping"], not_loaded
    rule = resumed_opt.damping_rule
    assert float(rule.start.asnumpy()) == -1.0
    dampings = []
    for x, y in batches[3:]:
        resumed_cell(Tensor(x), Tensor(y))
        dampings.append(float(rule.value.asnumpy()))
    assert float(rule.start.asnumpy()) == resumed_with, (rule.start.asnumpy(), resumed_with)
    assert min(dampings) >= np.float32(resumed_with), (dampings, resumed_with)


def test_checkpoint_resume_continues_adaptive_thor_identically(mode, tmp_path):
    """Every piece of adaptive state (the damping, the calibration, the previous update, the stored factors
    and inverses, the step) is in the training cell's checkpoint: 3 steps, save, load into a fresh cell,
    3 more steps give the uninterrupted run's parameters and state."""
    batches = [mlp_batches(np.random.default_rng(40 + i), 1, batch=64)[0] for i in range(6)]
    net, opt, cell = _adaptive_cell()
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
    first, first_opt, first_cell = _adaptive_cell()
    for x, y in batches[:3]:
        first_cell(Tensor(x), Tensor(y))
    path = str(tmp_path / "adaptive.ckpt")
    ms.save_checkpoint(first_cell, path)
    resumed, resumed_opt, resumed_cell = _adaptive_cell(seed=99)  # other initial weights: all must be loaded
    not_loaded, _ = ms.load_param_into_net(resumed_cell, ms.load_checkpoint(path))
    assert not not_loaded, not_loaded
    for x, y in batches[3:]:
        resumed_cell(Tensor(x), Tensor(y))
    for name, value in param_values(net).items():
        np.testing.assert_array_equal(param_values(resumed)[name], value, err_msg=name)
    for attr in ("calibration", "step_size", "momentum_coefficient"):
        assert float(getattr(resumed_opt.step_rule, attr).asnumpy()) == float(
            getattr(opt.step_rule, attr).asnumpy()), attr
    assert float(resumed_opt.damping_rule.value.asnumpy()) == float(opt.damping_rule.value.asnumpy())
    assert float(opt.step_rule.calibration.asnumpy()) != 1.0
