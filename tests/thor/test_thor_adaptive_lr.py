"""``thor(..., learning_rate="adaptive")`` against its float64 oracle (``reference.thor_adaptive_ref``): the trial
and final step sizes and momenta, the measured calibration kappa and the parameters, step by step, in both modes,
with a damping schedule and with ``damping="adaptive"`` (whose ratio is the trial's against its calibrated
model), through
ms_optim's training cell, the loss-scale cell and ``ModelThor``'s sink; a rejected trial; MindSpore's own cell
refused before any update; the fallbacks of the solve; what the adaptive step does where a fixed one fails; the
refusals."""
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.amp import DynamicLossScaleManager
from reference.thor_adaptive_ref import AdaptiveLrDampingReference, AdaptiveLrThorReference
from reference.thor_adaptive_ref import averaged_coefficients as averaged_ref
from reference.thor_adaptive_ref import solve_coefficients as solve_ref
from reference.thor_ref import EmbedRef, MLPRef
from support import adaptive_lr_checks as checks
from support.nets import MLP, EmbedNet, labelled_batches
from support.params import param_values
from support.thor_runs import ATOL, RTOL, compare, init_params, mlp_batches, train_cell

from ms_optim import nn as ms_nn
from ms_optim import thor
from ms_optim._thor.step import quad_model
from ms_optim._thor.step import quadratic_rule as adaptive_lr
from ms_optim._thor.step.optimizer import unprobed_message

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
    # the trace rule (thresholds 0: every layer's factors count as changed, so it inverts as the schedule)
    "mlp_trace_rule_at_zero": (MLP, MLPRef(), dict(trace_thresholds=0.0), dict()),
    "mlp_clip_grad_full": (MLP, MLPRef(), dict(enable_clip_grad=True, inverse="full"),
                           dict(enable_clip_grad=True, block_size=None)),
    "embedding_layernorm": (EmbedNet, EmbedRef(1e-7), dict(weight_decay=5e-3, decay_filter=lambda p: _keep(p.name)),
                            dict(weight_decay=5e-3, decay_filter=_keep, layernorm=("ln",))),
}


def _batch_size(case):
    """Large enough that the fixed batch is not learnt by heart within STEPS: the loss then stays far above float32's
    rounding, and so do the loss changes the calibration is measured from."""
    return 16 if case.startswith("embedding") else 64


def _batch(rng, case, size=None):
    """One fixed batch (every step trains on it: the model's prediction is checked on a problem it can solve)."""
    size = size or _batch_size(case)
    if case.startswith("embedding"):
        return rng.integers(0, 12, (size, 3)).astype(np.int32), rng.integers(0, 4, size).astype(np.int32)
    return mlp_batches(rng, 1, batch=size)[0]


def _train_cell(net, opt):
    """ms_optim's TrainOneStepCell (the pass at the trial point) with mean sparse softmax cross-entropy."""
    return ms_nn.TrainOneStepCell(_loss_net(net), opt).set_train()


def _exercised(ref):
    """The loss went down; with momentum="adaptive" step 0 took the 1-D step (no previous update) and later steps
    the 2-D one; with a momentum mu every kept step has beta = mu (and some step was kept after step 0)."""
    assert ref.losses[-1] < 0.5 * ref.losses[0], ref.losses
    if ref.momentum_rule == "adaptive":
        assert ref.betas[0] == 0.0 and any(abs(b) > 1e-3 for b in ref.betas[1:]), ref.betas
    else:  # the kl_clip trust region scales beta with alpha
        kept = [b for b, rejected in zip(ref.betas, ref.rejected) if not rejected]
        mu = ref.momentum_rule
        assert len(kept) > 1 and all(b == mu if ref.kl_clip is None else 0 < b <= mu for b in kept), (
            ref.betas, ref.rejected)


def _unclipped(ref, m, b):
    """The oracle's step for ``M, b`` without the trust region."""
    if ref.momentum_rule == "adaptive":
        return np.array(solve_ref(m, b))
    return np.array(averaged_ref(m, b, ref.momentum_rule))


# momentum 0.5 rather than 0.9: the trial is (1 - mu) times the model's step, and the loss change it makes must
# stay far above float32's rounding for the measured calibration to be comparable with the float64 oracle's
@pytest.mark.parametrize("momentum", ["adaptive", 0.5])
@pytest.mark.parametrize("case", sorted(CASES))
def test_adaptive_lr_with_damping_schedule_matches_reference(mode, rng, case, momentum):
    """A damping schedule, through ms_optim's TrainOneStepCell (the loss at the trial point, every step)."""
    make, model, kwargs, ref_kwargs = CASES[case]
    net = make()
    init_params(net, rng)
    damping = np.linspace(0.5, 0.2, STEPS).astype(np.float32)
    size = _batch_size(case)
    ref = AdaptiveLrThorReference(model, param_values(net), damping, momentum, batch_size=size,
                                  frequency=FREQUENCY, **ref_kwargs)
    opt = thor(net, "adaptive", Tensor(damping), momentum, batch_size=size, frequency=FREQUENCY, **kwargs)
    cell = _train_cell(net, opt)
    x, y = _batch(rng, case)
    for step in range(STEPS):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        checks.check_step(net, opt, ref, step, loss)
    _exercised(ref)
    checks.measured_kappa_checked(ref)
    if case == "mlp_kl_clip":  # the trust region was active on some trial, and on some final step
        unclipped = [_unclipped(ref, s["M"], s["b"]) for s in ref.systems]
        assert any(float(w @ s["M"] @ w) > 0.05 * 1.01 for w, s in zip(unclipped, ref.systems)), unclipped
        finals = [ref.model_matrix(s, k) for s, k in zip(ref.systems, ref.kappas)]
        unclipped = [_unclipped(ref, m, s["b"]) for m, s in zip(finals, ref.systems)]
        clipped = [t for t, (w, m) in enumerate(zip(unclipped, finals)) if float(w @ m @ w) > 0.05 * 1.01]
        assert clipped and not any(ref.rejected), unclipped
        for t in clipped:  # the final step on the boundary of the trust region of M(kappa')
            w = np.array([ref.alphas[t], ref.betas[t]])
            assert float(w @ finals[t] @ w) == pytest.approx(0.05, rel=1e-9)
    if case == "mlp_clip_grad_full":
        assert opt.inverse == "full"


def _adaptive_both(rng, case="mlp", adapt_every=2, size=None, momentum=0.9):
    """Both adaptive on ``case``'s net ("mlp" or "embedding..."): (net, optimizer, oracle)."""
    size = size or _batch_size(case)
    make, model, ref_kwargs = ((EmbedNet, EmbedRef(1e-7), dict(layernorm=("ln",))) if case.startswith("embedding")
                               else (MLP, MLPRef(), {}))
    net = make()
    init_params(net, rng)
    ref = AdaptiveLrDampingReference(model, param_values(net), momentum, batch_size=size, frequency=FREQUENCY,
                                     adapt_every=adapt_every, **ref_kwargs)
    opt = thor(net, "adaptive", "adaptive", momentum, batch_size=size, frequency=FREQUENCY,
               adapt_every=adapt_every)
    return net, opt, ref


def _check_damping(opt, ref, step):
    """The damping after ``step``; on an adaptation step the rule's record: the trial's ratio, L_p - L0 and the
    change the trial's calibrated model predicted."""
    rule = opt.damping_rule
    np.testing.assert_allclose(checks.value(rule.value), ref.dampings[-1], rtol=1e-5,
                               err_msg=f"damping after step {step}")
    if ref.ratios and ref.ratios[-1][0] == step:
        np.testing.assert_allclose(checks.value(rule.predicted), ref.predicted[-1][1], rtol=RTOL,
                                   err_msg=f"predicted change of step {step}")
        np.testing.assert_allclose(checks.value(rule.loss_change), ref.changes[-1][1], rtol=RTOL, atol=ATOL,
                                   err_msg=f"L_p - L0 of step {step}")
        np.testing.assert_allclose(checks.value(rule.ratio), ref.ratios[-1][1], rtol=RTOL, atol=RTOL,
                                   err_msg=f"ratio of step {step}")


@pytest.mark.parametrize("momentum", ["adaptive", 0.5])
def test_adaptive_lr_with_adaptive_damping_matches_reference(mode, path, rng, momentum):
    """Both adaptive, through ms_optim's TrainOneStepCell (the pass at the trial point); the fused CPU ops and the
    composite ones (GPU, Ascend) alike."""
    net, opt, ref = _adaptive_both(rng, momentum=momentum)
    cell = _train_cell(net, opt)
    x, y = _batch(rng, "mlp")
    for step in range(STEPS):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        checks.check_step(net, opt, ref, step, loss)
        _check_damping(opt, ref, step)
    _exercised(ref)
    checks.measured_kappa_checked(ref)
    assert [t for t, _ in ref.ratios] == list(range(1, STEPS, 2))  # the adaptation steps (ratios compared)
    assert min(ref.dampings) == ref.dampings[0], ref.dampings  # never below the first step's damping


def test_adaptive_damping_ratio_is_the_trials_against_its_calibrated_model(mode, path, rng):
    """Both adaptive (momentum too), adapting every step, on the embedding + LayerNorm net: each step's ratio is
    ``(L_p - L0) / q_c``, ``q_c`` the change the trial's own model predicted (the damped Kronecker model times
    the kappa the trial was made with); after a ratio below 1/4 the damping rises by ``1 / omega``, after one
    above 3/4 it falls by ``omega``, and it never falls below the first step's damping."""
    net, opt, ref = _adaptive_both(rng, "embedding", adapt_every=1, size=32, momentum="adaptive")
    cell = _train_cell(net, opt)
    x, y = _batch(rng, "embedding", 32)
    rule = opt.damping_rule
    moves = {"rise": 0, "fall": 0, "floor": 0}
    kappa = 1.0  # the calibration the next trial is made with
    start = None
    for step in range(3 * STEPS):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        checks.check_step(net, opt, ref, step, loss)
        _check_damping(opt, ref, step)
        if start is None:  # the first step's damping, the floor (float32, as the step computes it)
            start = checks.value(rule.start)
            np.testing.assert_allclose(start, ref.dampings[0], rtol=1e-5)
        (a0, b0), (_, k_d), e = ref.trials[-1], ref.curvatures[-1], ref.systems[-1]["e"]
        predicted = a0 * e[0] + b0 * e[1] + 0.5 * kappa * k_d
        rho = (ref.trial_losses[-1] - ref.losses[-1]) / predicted
        assert predicted < 0 and ref.ratios[-1] == (step, rho), (step, predicted, ref.ratios[-1])
        np.testing.assert_allclose(checks.value(rule.ratio), rho, rtol=RTOL, atol=RTOL, err_msg=f"ratio of {step}")
        taken_with = checks.value(opt.step_rule.step_damping)  # the damping this step used
        after = checks.value(rule.value)
        np.testing.assert_allclose(after, checks.calibrated_damping_after(taken_with, rho, start, 0.95), rtol=1e-6,
                                   err_msg=f"step {step}, ratio {rho}")
        if rho < 0.25:
            moves["rise"] += 1
        elif rho > 0.75:
            moves["fall" if taken_with * 0.95 > start else "floor"] += 1
        assert after >= np.float32(start), (step, after, start)
        kappa = ref.kappas[-1]
    assert moves["rise"] and moves["fall"] and moves["floor"], (moves, ref.ratios)


def test_rejected_trial_keeps_the_parameters_and_grows_kappa(mode, rng):
    """The embedding + LayerNorm case on 24 samples, momentum="adaptive": step 2's trial, made with the kappa
    step 1 measured (0.6), raises the loss. Nothing of it is kept: the parameters are those before the step, the
    stored update (``moments``) is 0 and kappa grows at least tenfold; step 3 starts again from there (no previous
    update: the 1-D step) with a trial ten times shorter, which is kept."""
    make, model, kwargs, ref_kwargs = CASES["embedding_layernorm"]
    net = make()
    init_params(net, rng)
    damping = np.linspace(0.5, 0.2, STEPS).astype(np.float32)
    ref = AdaptiveLrThorReference(model, param_values(net), damping, "adaptive", batch_size=24,
                                  frequency=FREQUENCY, **ref_kwargs)
    opt = thor(net, "adaptive", Tensor(damping), "adaptive", batch_size=24, frequency=FREQUENCY, **kwargs)
    cell = _train_cell(net, opt)
    x, y = _batch(rng, "embedding", 24)
    rule = opt.step_rule
    for step in range(4):
        before, kappa = param_values(net), checks.value(rule.calibration)
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        checks.check_step(net, opt, ref, step, loss)
        if not ref.rejected[-1]:
            continue
        assert ref.trial_losses[-1] > ref.losses[-1] + 0.1  # far from a tie: the decision is not float32 noise
        after = param_values(net)
        for name, value in before.items():  # w + p - p in float32: equal up to the rounding of w + p
            np.testing.assert_allclose(after[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
        for moment in opt.moments:
            assert not np.any(moment.asnumpy()), moment.name
        assert (checks.value(rule.step_size), checks.value(rule.momentum_coefficient)) == (0.0, 0.0)
        assert checks.value(rule.calibration) >= 10.0 * kappa * (1 - 1e-6), (kappa, checks.value(rule.calibration))
    assert ref.rejected == [False, False, True, False], ref.rejected
    assert ref.losses[3] == ref.losses[2] and ref.trial_losses[3] < ref.losses[3]  # step 3 from the same point
    assert ref.trials[3][1] == 0.0 and ref.betas[3] == 0.0


@pytest.mark.parametrize("momentum", ["adaptive", 0.9])
def test_trial_below_the_loss_resolution_is_kept_and_lengthens_the_next(mode, rng, momentum):
    """A calibration at its cap (as after a run of rejected trials near a minimum) makes a trial too short for the
    float32 loss to resolve: its measured curvature is rounding noise. It is neither read as a curvature nor
    rejected: the step is kept, kappa halves (the next trial twice as long) and the damping stays, so the run
    climbs back instead of stopping for good (kappa pinned at its cap, the damping rising to its bound)."""
    net, opt, ref = _adaptive_both(rng, adapt_every=1, momentum=momentum)
    cell = _train_cell(net, opt)
    x, y = _batch(rng, "mlp")
    rule = opt.step_rule
    for _ in range(2):
        cell(Tensor(x), Tensor(y))
    kappa = adaptive_lr.KAPPA_MAX
    for step in range(3):
        ops.assign(rule.calibration, Tensor(np.float32(kappa)))  # (in place: the compiled step writes it)
        for moment in opt.moments:  # no previous update (as after a rejected trial)
            ops.assign(moment, Tensor(np.zeros(moment.shape, np.float32)))
        damping = checks.value(opt.damping_rule.value)
        before = param_values(net)
        cell(Tensor(x), Tensor(y))
        change, predicted = checks.value(opt.damping_rule.loss_change), checks.value(opt.damping_rule.predicted)
        assert abs(change) <= 2.0 ** -16 and abs(predicted) <= 2.0 ** -16, (change, predicted)  # loss near 1
        assert checks.value(rule.calibration) == np.float32(0.5 * kappa), step
        assert checks.value(rule.step_size) > 0.0, step  # kept
        assert checks.value(opt.damping_rule.value) == damping, step
        moved = [np.max(np.abs(param_values(net)[name] - value)) for name, value in before.items()]
        assert max(moved) < 1e-6, moved
        kappa = checks.value(rule.calibration)


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
        checks.check_step(net, opt, ref, step, loss)
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
    model.train(2, labelled_batches(np.tile(x, (STEPS, 1)), np.tile(y, STEPS), len(x)), dataset_sink_mode=True,
                sink_size=STEPS // 2)
    for _ in range(STEPS):
        ref.step(x, y)
    compare(net, ref, STEPS - 1)
    np.testing.assert_allclose(checks.value(opt.step_rule.step_size), ref.alphas[-1], rtol=RTOL)
    np.testing.assert_allclose(checks.value(opt.step_rule.calibration), ref.kappas[-1], rtol=RTOL)
    np.testing.assert_allclose(checks.value(opt.damping_rule.value), ref.dampings[-1], rtol=1e-5)
    _exercised(ref)


def test_mindspore_cell_is_refused_before_any_update(mode, rng):
    """MindSpore's own TrainOneStepCell never measures the trial: the step raises when it compiles, and nothing
    has moved (parameters, stored update, kappa)."""
    net = MLP()
    init_params(net, rng)
    opt = thor(net, "adaptive", Tensor(0.3), 0.9, batch_size=8, frequency=FREQUENCY)
    before = param_values(net)
    cell = nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    (x, y), = mlp_batches(rng, 1, batch=8)
    message = unprobed_message(opt.config)
    assert "learning_rate='adaptive' needs the loss at a trial point" in message
    with pytest.raises(RuntimeError, match=re.escape(message[:message.index(":")])):
        cell(Tensor(x), Tensor(y))
    after = param_values(net)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert not any(np.any(moment.asnumpy()) for moment in opt.moments)
    assert checks.value(opt.step_rule.calibration) == 1.0


def test_momentum_is_beta_and_weights_the_model_step(mode, rng):
    """momentum=mu: every kept step has beta = mu, and the first trial (no previous update, kappa 1: the same
    system for every momentum) is (1 - mu) times momentum="adaptive"'s 1-D step."""
    (x, y), = mlp_batches(rng, 1, batch=8)
    first_trials = {}
    for momentum in ("adaptive", 0.0, 0.5):
        net = MLP()
        init_params(net, np.random.default_rng(5))
        opt = thor(net, "adaptive", Tensor(0.3), momentum, batch_size=8, frequency=FREQUENCY)
        cell = _train_cell(net, opt)
        rule = opt.step_rule
        for step in range(3):
            cell(Tensor(x), Tensor(y))
            if step == 0:
                first_trials[momentum] = (checks.value(rule.trial_step_size),
                                          checks.value(rule.trial_momentum_coefficient))
            if momentum != "adaptive" and checks.value(rule.step_size) != 0.0:
                assert checks.value(rule.momentum_coefficient) == momentum, (momentum, step)
    alpha = first_trials["adaptive"][0]
    assert alpha > 0 and first_trials["adaptive"][1] == 0.0
    assert first_trials[0.0] == (alpha, 0.0)
    assert first_trials[0.5] == (pytest.approx(0.5 * alpha, rel=1e-6), 0.5)


def _loss_after_one_step(rng, learning_rate):
    net = MLP()
    init_params(net, np.random.default_rng(9))
    (x, y), = mlp_batches(np.random.default_rng(10), 1, batch=8)
    opt = thor(net, learning_rate, Tensor(0.3), 0.0, batch_size=8, frequency=FREQUENCY)
    cell = _train_cell(net, opt) if learning_rate == "adaptive" else train_cell(net, opt)
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
def test_averaged_coefficients_match_reference_and_are_finite(mode, name, kl_clip):
    system = np.array(SYSTEMS[name], np.float64)
    m = np.array([[system[0], system[1]], [system[1], system[2]]])
    want = averaged_ref(m, system[3:], 0.9, kl_clip)
    clip = None if kl_clip is None else Tensor(kl_clip, ms.float32)
    alpha, beta = quad_model.coefficients(Tensor(m.astype(np.float32)), Tensor(system[3:].astype(np.float32)), 0.9,
                                          clip)
    got = (float(alpha.asnumpy()), float(beta.asnumpy()))
    assert np.all(np.isfinite(got)), got
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    expected = {"regular": (0.05, 0.9), "first_step": (0.05, 0.9), "parallel": (0.1, 0.9), "nan": (0.05, 0.9),
                "inf_b": (0.0, 0.0), "zero": (0.0, 0.0)}[name]
    if kl_clip is None:
        assert want == pytest.approx(expected)


@pytest.mark.parametrize("name", sorted(SYSTEMS))
@pytest.mark.parametrize("kl_clip", [None, 0.1])
def test_solve_coefficients_matches_reference_and_is_finite(mode, name, kl_clip):
    system = np.array(SYSTEMS[name], np.float64)
    m = np.array([[system[0], system[1]], [system[1], system[2]]])
    want = solve_ref(m, system[3:], kl_clip)
    clip = None if kl_clip is None else Tensor(kl_clip, ms.float32)
    alpha, beta = quad_model.coefficients(Tensor(m.astype(np.float32)), Tensor(system[3:].astype(np.float32)), None,
                                          clip)
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
    (dict(momentum=1.0), ValueError, "'momentum' must be less than 1.0.*but got 1.0"),
    (dict(momentum="adaptiv"), TypeError, "'momentum'"),
    (dict(learning_rate=Tensor(0.1), momentum="adaptive"), ValueError,
     "momentum='adaptive' needs learning_rate='adaptive'"),
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


def test_modes_choose_the_step_rule_once():
    """One optimizer class for every mode: the config names the modes, and the step rule is chosen from them
    when the optimizer is built."""
    from ms_optim._thor.step.momentum_rule import MomentumRule
    from ms_optim._thor.step.optimizer import ThorOptimizer
    from ms_optim._thor.step.quadratic_rule import QuadraticRule

    scheduled = thor(MLP(), Tensor(0.1), Tensor(0.03), 0.9)
    assert type(scheduled) is ThorOptimizer and type(scheduled.step_rule) is MomentumRule
    assert (scheduled.config.lr_mode, scheduled.config.damping_mode) == ("scheduled", "scheduled")
    assert not scheduled.measures_loss
    adaptive = thor(MLP(), "adaptive", Tensor(0.03), 0.9)
    assert type(adaptive) is ThorOptimizer and type(adaptive.step_rule) is QuadraticRule
    assert (adaptive.config.lr_mode, adaptive.config.momentum_mode) == ("adaptive", "scheduled")
    assert adaptive.config.momentum == 0.9 and adaptive.step_rule.momentum == 0.9 and adaptive.measures_loss
    both = thor(MLP(), "adaptive", Tensor(0.03), "adaptive")
    assert both.config.momentum_mode == "adaptive" and both.config.momentum == 0.0
    assert both.step_rule.momentum is None
    assert float(adaptive.get_lr().asnumpy()) == 0.0


