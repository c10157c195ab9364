"""The step-by-step comparison of ``thor(..., learning_rate="adaptive")`` with its float64 oracle
(``reference.thor_adaptive_ref``): the 2x2 system, the trial's and the final coefficients, the calibration kappa
and the parameters after every step."""
import numpy as np
from reference.thor_adaptive_ref import damping_factor

from support.thor_runs import RTOL, compare


def pair_close(got, want, what):
    """Two coefficients as a vector, to RTOL of its size."""
    # as a vector, to RTOL of its size: near convergence one coefficient can be a small difference of float32
    # products (the 2x2 solve's cancellation), e.g. alpha = -0.039 beside beta = 0.9
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * max(abs(v) for v in want), err_msg=what)


def calibrated_damping_after(before: float, ratio: float, start: float, omega: float) -> float:
    """The damping after an adaptation step of ``learning_rate="adaptive"`` with ``damping="adaptive"``, from
    the trial's ``ratio``: ``before / omega`` below 1/4, ``max(before * omega, start)`` above 3/4 (never below
    the first step's damping ``start``), else ``before``."""
    factor = damping_factor(ratio, omega)
    return max(before * factor, start) if factor < 1.0 else before * factor


def value(parameter) -> float:
    """A scalar Parameter's value."""
    return float(parameter.asnumpy())


def check_system(rule, ref, step):
    """The 13 terms of the step's 2x2 system (``thor_system``: K, N, W as (xx, xy, yy), then b, e), each group to
    RTOL of its largest entry (a term of y is 0 where there is no previous update)."""
    want = ref.systems[-1]
    got = rule.system.asnumpy().astype(np.float64)
    groups = [(name, [want[name][0, 0], want[name][0, 1], want[name][1, 1]]) for name in ("K", "N", "W")]
    groups += [("b", list(want["b"])), ("e", list(want["e"]))]
    start = 0
    for name, values in groups:
        scale = max(abs(v) for v in values)
        np.testing.assert_allclose(got[start:start + len(values)], values, rtol=RTOL, atol=RTOL * scale,
                                   err_msg=f"{name} of step {step}")
        start += len(values)
    np.testing.assert_allclose(value(rule.step_damping), want["d"], rtol=1e-5, err_msg=f"damping of step {step}")


def check_step(net, opt, ref, step, loss):
    """The loss, the system, the trial's and the final (alpha, beta), kappa and every parameter after ``step``."""
    np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL, err_msg=f"loss at step {step}")
    rule = opt.step_rule
    check_system(rule, ref, step)
    pair_close([value(rule.trial_step_size), value(rule.trial_momentum_coefficient)], list(ref.trials[-1]),
               f"trial (a0, b0) of step {step}")
    pair_close([value(rule.step_size), value(rule.momentum_coefficient)], [ref.alphas[-1], ref.betas[-1]],
               f"(alpha, beta) of step {step}")
    np.testing.assert_allclose(value(rule.calibration), ref.kappas[-1], rtol=RTOL, err_msg=f"kappa after {step}")
    compare(net, ref, step)


def measured_kappa_checked(ref):
    """Some step kept its trial with kappa' = m (the measurement itself, neither floor nor cap): the comparison of
    kappa with the oracle then compared the measured calibration (m != 1: the model was really recalibrated)."""
    measured = [t for t, (k, m) in enumerate(zip(ref.kappas, ref.measured)) if not ref.rejected[t] and k == m]
    assert measured and any(abs(ref.kappas[t] - 1.0) > 0.05 for t in measured), (ref.kappas, ref.measured)
