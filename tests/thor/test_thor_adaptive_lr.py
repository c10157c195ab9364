"""``thor(..., learning_rate="adaptive")`` against its float64 oracle (``reference.thor_adaptive_ref``): the 2x2
system, the chosen step size and momentum and the parameters, step by step, in both modes, with a damping
schedule and with ``damping="adaptive"``, through MindSpore's and ms_optim's training cells, the loss-scale cell
and ``ModelThor``'s sink; the fallbacks of the solve; what the adaptive step does where a fixed one fails; the
refusals."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.amp import DynamicLossScaleManager
from reference.thor_adaptive_ref import AdaptiveLrDampingReference, AdaptiveLrThorReference
from reference.thor_adaptive_ref import solve_coefficients as solve_ref
from reference.thor_ref import EmbedRef, MLPRef
from support.nets import MLP, EmbedNet, labelled_batches
from support.params import param_values
from support.thor_runs import RTOL, compare, init_params, mlp_batches, train_cell

from ms_optim import nn as ms_nn
from ms_optim import thor
from ms_optim._thor.adaptive_lr import solve_coefficients

STEPS = 6
FREQUENCY = 3


def _loss_net(net):
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def _keep(name):
    return "bias" not in name and not name.startswith("ln.")


# (net, oracle model, thor() keywords, oracle keywords); every case: weight decay, a damping schedule
CASES = {
    "mlp": (MLP, MLPRef(), dict(weight_decay=1e-3), dict(weight_decay=1e-3)),
    "mlp_kl_clip": (MLP, MLPRef(), dict(kl_clip=0.05), dict(kl_clip=0.05)),
    "mlp_clip_grad_full": (MLP, MLPRef(), dict(enable_clip_grad=True, inverse="full"),
                           dict(enable_clip_grad=True, block_size=None)),
    "embedding_layernorm": (EmbedNet, EmbedRef(1e-7), dict(weight_decay=5e-3, decay_filter=lambda p: _keep(p.name)),
                            dict(weight_decay=5e-3, decay_filter=_keep, layernorm=("ln",))),
}


def _batch(rng, case):
    """One fixed batch (every step trains on it: the model's prediction is checked on a problem it can solve)."""
    if case.startswith("embedding"):
        return rng.integers(0, 12, (8, 3)).astype(np.int32), rng.integers(0, 4, 8).astype(np.int32)
    return mlp_batches(rng, 1, batch=8)[0]


def _check(net, opt, ref, step, loss):
    np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL, err_msg=f"loss at step {step}")
    rule = opt.quadratic_step
    got = [float(rule.step_size.asnumpy()), float(rule.momentum_coefficient.asnumpy())]
    want = [ref.alphas[-1], ref.betas[-1]]
    # (alpha, beta) as a vector, to RTOL of its size: near convergence one coefficient can be a small difference
    # of float32 products (the 2x2 solve's cancellation), e.g. alpha = -0.039 beside beta = 0.9
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * max(abs(v) for v in want),
                               err_msg=f"(alpha, beta) of step {step}")
    compare(net, ref, step)


def _exercised(ref):
    """Step 0 took the 1-D step (no previous update), later steps the 2-D one, and the loss went down."""
    assert ref.betas[0] == 0.0 and any(abs(b) > 1e-3 for b in ref.betas[1:]), ref.betas
    assert ref.losses[-1] < 0.5 * ref.losses[0], ref.losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_adaptive_lr_with_damping_schedule_matches_reference(mode, rng, case):
    """With a damping schedule no extra pass is needed: MindSpore's own TrainOneStepCell steps it."""
    make, model, kwargs, ref_kwargs = CASES[case]
    net = make()
    init_params(net, rng)
    damping = np.linspace(0.5, 0.2, STEPS).astype(np.float32)
    ref = AdaptiveLrThorReference(model, param_values(net), damping, batch_size=8, frequency=FREQUENCY,
                                  **ref_kwargs)
    opt = thor(net, "adaptive", Tensor(damping), 0.9, batch_size=8, frequency=FREQUENCY, **kwargs)
    cell = train_cell(net, opt)
    x, y = _batch(rng, case)
    for step in range(STEPS):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        _check(net, opt, ref, step, loss)
    _exercised(ref)
    if case == "mlp_kl_clip":  # the trust region was active on some step
        unclipped = [np.array(solve_ref(m, b)) for m, b in ref.systems]
        assert any(float(w @ m @ w) > 0.05 * 1.01 for w, (m, _) in zip(unclipped, ref.systems)), unclipped
    if case == "mlp_clip_grad_full":
        assert opt.inverse == "full"


def _adaptive_both(rng, **kwargs):
    net = MLP()
    init_params(net, rng)
    ref = AdaptiveLrDampingReference(MLPRef(), param_values(net), batch_size=8, frequency=FREQUENCY, adapt_every=2)
    opt = thor(net, "adaptive", "adaptive", 0.9, batch_size=8, frequency=FREQUENCY, adapt_every=2, **kwargs)
    return net, opt, ref


def _check_damping(opt, ref, step):
    np.testing.assert_allclose(float(opt.damping_rule.value.asnumpy()), ref.dampings[-1], rtol=1e-5,
                               err_msg=f"damping after step {step}")
    if ref.ratios and ref.ratios[-1][0] == step:  # q of the step actually taken (alpha x + beta y)
        np.testing.assert_allclose(float(opt.damping_rule.predicted.asnumpy()), ref.predicted[-1][1], rtol=RTOL,
                                   err_msg=f"q of step {step}")


def test_adaptive_lr_with_adaptive_damping_matches_reference(mode, rng):
    """kfac-jax's default combination, through ms_optim's TrainOneStepCell (the extra pass)."""
    net, opt, ref = _adaptive_both(rng)
    cell = ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    x, y = _batch(rng, "mlp")
    for step in range(STEPS):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        _check(net, opt, ref, step, loss)
        _check_damping(opt, ref, step)
    _exercised(ref)
    assert len(set(ref.dampings)) > 1, ref.dampings  # the damping moved


def test_adaptive_lr_under_dynamic_loss_scale(mode, rng):
    """The loss-scale cell: the unscaled trajectory (the stored G's scale is tracked across scale changes)."""
    net, opt, ref = _adaptive_both(rng)
    manager = DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=2)
    cell = ms_nn.TrainOneStepWithLossScaleCell(_loss_net(net), opt, scale_sense=manager.get_update_cell())
    cell.set_train()
    x, y = _batch(rng, "mlp")
    for step in range(STEPS):
        loss, overflow, _ = cell(Tensor(x), Tensor(y))
        assert not bool(overflow.asnumpy())
        ref.step(x, y)
        _check(net, opt, ref, step, loss)
        _check_damping(opt, ref, step)
    assert float(cell.scale_sense.asnumpy()) > 2.0 ** 10  # the scale changed between THOR steps
    _exercised(ref)


def test_adaptive_lr_model_thor_sink_matches_reference(mode, rng):
    from ms_optim.train_thor import ConvertModelUtils

    net, opt, ref = _adaptive_both(rng)
    x, y = _batch(rng, "mlp")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.train.Model(net, loss_fn=loss, optimizer=opt)
    model = ConvertModelUtils.convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
    model.train(2, labelled_batches(np.tile(x, (STEPS, 1)), np.tile(y, STEPS), 8), dataset_sink_mode=True,
                sink_size=STEPS // 2)
    for _ in range(STEPS):
        ref.step(x, y)
    compare(net, ref, STEPS - 1)
    np.testing.assert_allclose(float(opt.quadratic_step.step_size.asnumpy()), ref.alphas[-1], rtol=RTOL)
    np.testing.assert_allclose(float(opt.damping_rule.value.asnumpy()), ref.dampings[-1], rtol=1e-5)
    _exercised(ref)


def test_momentum_argument_is_not_used(mode, rng):
    """The momentum coefficient is the model's beta: momentum=0.0 and 0.9 give the same parameters."""
    (x, y), = mlp_batches(rng, 1, batch=8)
    runs = []
    for momentum in (0.0, 0.9):
        net = MLP()
        init_params(net, np.random.default_rng(5))
        cell = train_cell(net, thor(net, "adaptive", Tensor(0.3), momentum, batch_size=8, frequency=FREQUENCY))
        for _ in range(3):
            cell(Tensor(x), Tensor(y))
        runs.append(param_values(net))
    for name, value in runs[0].items():
        np.testing.assert_array_equal(runs[1][name], value, err_msg=name)


def _loss_after_one_step(rng, learning_rate):
    net = MLP()
    init_params(net, np.random.default_rng(9))
    (x, y), = mlp_batches(np.random.default_rng(10), 1, batch=8)
    cell = train_cell(net, thor(net, learning_rate, Tensor(0.3), 0.0, batch_size=8, frequency=FREQUENCY))
    before = float(cell(Tensor(x), Tensor(y)).asnumpy())
    after = float(_loss_net(net)(Tensor(x), Tensor(y)).asnumpy())
    return before, after


def test_adaptive_step_decreases_the_loss_where_a_large_fixed_lr_increases_it(mode, rng):
    before, after_fixed = _loss_after_one_step(rng, Tensor(40.0))
    assert after_fixed > before  # the fixed step overshoots
    before_adaptive, after_adaptive = _loss_after_one_step(rng, "adaptive")
    assert before_adaptive == pytest.approx(before, rel=1e-6)
    assert after_adaptive < before


# ----------------------------------------------------------------------------- the solve's fallbacks
SYSTEMS = {  # (M00, M01, M11, b0, b1)
    "regular": (2.0, 0.5, 1.0, -1.0, 0.3),
    "first_step": (2.0, 0.0, 0.0, -1.0, 0.0),          # no previous update: the 1-D step
    "parallel": (1.0, 2.0, 4.0, -1.0, -2.0),           # y = 2x: det = 0, the 1-D step
    "nan": (2.0, float("nan"), 1.0, -1.0, 0.3),        # a non-finite cross term: the 1-D step
    "inf_b": (2.0, 0.5, 1.0, float("inf"), 0.3),       # nothing finite: no step
    "zero": (0.0, 0.0, 0.0, 0.0, 0.0),                 # a zero gradient: no step
}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
@pytest.mark.parametrize("kl_clip", [None, 0.1])
def test_solve_coefficients_matches_reference_and_is_finite(mode, name, kl_clip):
    system = np.array(SYSTEMS[name], np.float64)
    m = np.array([[system[0], system[1]], [system[1], system[2]]])
    want = solve_ref(m, system[3:], kl_clip)
    clip = None if kl_clip is None else Tensor(kl_clip, ms.float32)
    alpha, beta = solve_coefficients(Tensor(system.astype(np.float32)), clip)
    got = (float(alpha.asnumpy()), float(beta.asnumpy()))
    assert np.all(np.isfinite(got)), got
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    expected = {"first_step": (0.5, 0.0), "parallel": (1.0, 0.0), "nan": (0.5, 0.0), "inf_b": (0.0, 0.0),
                "zero": (0.0, 0.0)}.get(name)
    if expected is not None and kl_clip is None:
        assert want == pytest.approx(expected)
    if name == "regular" and kl_clip is not None:  # the trust region: w^T M w == kl_clip
        w = np.array(want)
        assert float(w @ m @ w) == pytest.approx(kl_clip, rel=1e-9)


# ----------------------------------------------------------------------------- refusals
BAD = [
    (dict(learning_rate="adaptiv"), ValueError, "'learning_rate' must be a Tensor or 'adaptive', but got 'adaptiv'"),
    (dict(learning_rate=0.1), TypeError, "'learning_rate' must be a Tensor"),
    (dict(use_nesterov=True), ValueError, "learning_rate='adaptive' needs use_nesterov=False.*but got "
                                          "use_nesterov=True"),
    (dict(momentum=-0.5), ValueError, "'momentum'"),
    (dict(momentum="adaptive"), TypeError, "'momentum'"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_adaptive_lr_arguments_are_refused(kwargs, error, match):
    net = MLP()
    call = dict(learning_rate="adaptive", damping=Tensor(0.03), momentum=0.9)
    call.update(kwargs)
    args = (call.pop("learning_rate"), call.pop("damping"), call.pop("momentum"))
    with pytest.raises(error, match=match):
        thor(net, *args, **call)
    assert all(type(cell).__name__ != "DenseThor" for _, cell in net.cells_and_names())  # nothing converted


def test_default_path_is_the_scheduled_optimizer():
    from ms_optim._thor.adaptive_lr import AdaptiveLrThorOptimizer
    from ms_optim._thor.optimizer import ThorOptimizer

    scheduled = thor(MLP(), Tensor(0.1), Tensor(0.03), 0.9)
    assert type(scheduled) is ThorOptimizer and not scheduled.config.adaptive_lr
    adaptive = thor(MLP(), "adaptive", Tensor(0.03), 0.9)
    assert type(adaptive) is AdaptiveLrThorOptimizer and adaptive.config.learning_rate is None
    assert float(adaptive.get_lr().asnumpy()) == 0.0
