"""``thor()``: MindSpore's THOR factory. Validate every argument once, then convert the net, then build the
optimizer.

``config.validate_thor`` turns the arguments into a frozen ``ThorConfig`` (a refused call raises before
anything is modified); :func:`build_thor` converts the net with the layers' final settings and builds
the optimizer from the config. Nothing else converts a net for THOR, and the optimizer never validates
or converts.
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn

from ms_optim._thor.adaptive_lr import AdaptiveLrThorOptimizer
from ms_optim._thor.config import ThorConfig, validate_thor
from ms_optim._thor.convert import convert_net
from ms_optim._thor.optimizer import ThorOptimizer
from ms_optim._thor.taps import ScheduleGuard, TapSettings

__all__ = ["thor", "build_thor"]

_NAME = "thor"


def build_thor(net: nn.Cell, config: ThorConfig) -> ThorOptimizer:
    """Convert ``net`` in place for ``config`` (every layer built with its convention, block width, schedule
    guard and shared tap) and build the optimizer (``config`` already validated)."""
    limits = config.schedule_limits
    # PYNATIVE: a step past their end is refused before the backward pass writes the factors; the guard
    # reads the optimizer's global_step, bound once the optimizer exists
    guard = ScheduleGuard(_NAME, Parameter(Tensor(np.zeros((1,), np.int32)), name="global_step"),
                          limits) if limits else None
    settings = TapSettings(config.factor_convention, config.batch_size, config.factor_block_size, guard)
    layers = convert_net(net, settings)  # thor_candidates' layers: the rule the validation counted with
    # learning_rate="adaptive": the update of ms_optim._thor.adaptive_lr, chosen here once
    optimizer = (AdaptiveLrThorOptimizer if config.adaptive_lr else ThorOptimizer)(net, layers, config)
    if guard is not None:
        guard.step = optimizer.global_step
    return optimizer


def thor(net, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0, batch_size=32,
         use_nesterov=False, decay_filter=lambda x: x.name not in [], split_indices=None,
         enable_clip_grad=False, frequency=100, *, inverse="blocked", block_size=128, kl_clip=None,
         factor_convention="auto", distribute_inverses=False, trace_thresholds=None, adapt_every=None,
         damping_bounds=None):
    r"""THOR, the second-order optimizer, with the signature of MindSpore's THOR factory, on every backend.

    Validates every argument first (a refused call leaves ``net`` untouched), then converts ``net``
    in place (``nn.Dense``/``nn.Conv2d``/``nn.Embedding`` -> their THOR versions, which collect the
    factors A and G), then returns the optimizer Cell (:class:`ThorOptimizer`). The update rule is in
    ``ms_optim._thor.optimizer``'s docstring: on steps ``0, f, 2f, ...`` the damped inverses
    ``(A + sqrt(damping[t]) I)^-1`` and ``(G + sqrt(damping[t]) I)^-1`` are recomputed; every step the
    weight gradients become ``G^-1 dW A^-1``, then weight decay, optional per-tensor clipping to
    norm 1 and momentum (``accum = m * accum + g; w -= lr[t] * accum``) follow.

    Args:
        net (Cell): the training network (converted in place).
        learning_rate (Union[Tensor, str]): per-step learning rates (1-D, indexed by the step) or one 0-D
            value. Or ``"adaptive"``: no schedule; every step is ``alpha x + beta y``, x the new
            preconditioned direction (after weight decay and clipping) and y the previous update, from THOR's
            quadratic model ``1/2 w^T M w + b^T w`` (M from the stored factors plus ``damping`` times the
            identity, scaled by a calibration measured every step from the loss at a trial point on the same
            batch, an extra forward pass of the training cell; b from the step's gradients):
            ``beta = momentum`` and ``alpha = (1 - momentum) * (-b0 / M00)`` (the model's step along x,
            averaged over steps by the momentum), or with ``momentum="adaptive"`` the ``(alpha, beta)``
            minimising the model (a 2x2 solve, the 1-D step ``(-b0 / M00, 0)`` when that system is singular
            or not finite); no step when the model gives no finite step or the trial raised the loss;
            ``kl_clip`` is the trust region ``w^T M w <= kl_clip`` and ``use_nesterov`` must be False. Works
            with a damping Tensor and with ``damping="adaptive"`` (``ms_optim._thor.adaptive_lr`` has the
            formulas). Train with ``ms_optim.nn.TrainOneStepCell``,
            ``ms_optim.nn.TrainOneStepWithLossScaleCell`` or ``ModelThor``, which run that pass.
        damping (Union[Tensor, str]): per-step damping (1-D) or one 0-D value; ``sqrt(damping)`` is added to
            the factors' diagonals. Or ``"adaptive"``: no schedule; the damping starts from a heuristic on
            the first step's factors and follows a Levenberg-Marquardt rule on the reduction ratio (the loss
            change of a step over the change THOR's quadratic model predicted), measured every
            ``adapt_every`` steps with an extra forward pass of the training cell; the inverses are
            recomputed when it changes (``ms_optim._thor.adaptive`` has the formulas). Train with
            ``ms_optim.nn.TrainOneStepCell``, ``ms_optim.nn.TrainOneStepWithLossScaleCell`` or ``ModelThor``,
            which run that pass.
        momentum (Union[float, str]): momentum, at least 0.0; below 1.0 with ``learning_rate="adaptive"``,
            where it may also be ``"adaptive"`` (chosen by the quadratic model each step).
        weight_decay (int, float): L2 penalty ``wd * w`` added on parameters ``decay_filter`` keeps.
            Default: 0.0.
        loss_scale (int, float): the static loss scale the gradients carry (divided out). G is divided
            by the square of ``factor_loss_scale``, which starts at this value; a dynamic loss-scale
            cell feeds the live scale with ``feed_loss_scale`` (see :class:`ThorOptimizer`).
            Greater than 0. Default: 1.0.
        batch_size (int): the batch size B, used by the LayerNorm rule ``g / (g^2 / B + sqrt(damping))``
            (a float with a whole value is taken as that int, as MindSpore's thor takes it). Default: 32.
        use_nesterov (bool): Nesterov momentum. Default: False.
        decay_filter (function): parameter -> bool, which parameters get weight decay.
            Default: all of them.
        split_indices (list[int]): data-parallel all-reduce groups of the factors, split after these
            layer indices (strictly increasing; an index past the last THOR layer splits nothing and is
            ignored with a warning). Read only in data-parallel training, as MindSpore's. Default: None
            (one group).
        enable_clip_grad (bool): clip every preconditioned gradient to L2 norm 1 (an int counts as its truth
            value, as in MindSpore's thor). Default: False.
        frequency (int): recompute factors and inverses every ``frequency`` steps; at least 2.
            Default: 100.
        inverse (str, keyword-only): ``"blocked"`` (diagonal blocks of ``block_size``, the default on
            every device, as MindSpore's GPU and Ascend kernels) or ``"full"`` (whole-matrix inverses).
        block_size (int, keyword-only): width of the diagonal blocks. Default: 128.
        kl_clip (float, keyword-only): None (default: no clipping, MindSpore's THOR exactly) or ``c > 0``
            (with ``learning_rate="adaptive"``: the trust region of the solved step, see there):
            every step, with ``g`` the gradients (divided by the loss scale) and ``v`` the preconditioned
            gradients of ALL trainable parameters (``v = g`` for parameters THOR does not precondition),
            taken after preconditioning and before weight decay, clipping and momentum, every ``v`` is
            multiplied by ``nu = min(1, sqrt(c / (lr[t]^2 * |sum v . g|)))`` (``nu = 1`` when that
            denominator is 0 or not finite): kfac-pytorch's KL clipping (``ms_optim._thor.kl_clip``).
        factor_convention (str, keyword-only): how A, G and the damping are normalised
            (``ms_optim._thor.conventions`` has the exact formulas and what differs from MindSpore);
            ``A_e``/``G_e`` are the factors the rule above inverts with ``sqrt(damping)``. With N rows
            (Dense/Embedding), ``in`` input features, ``counts`` the id counts, B the batch, T = Ho*Wo,
            ``n = B*T``, ``bs = batch_size``, conv patches p and output gradients d (``pm``/``dm`` their
            batch means):

            * ``"kfc"``: Dense ``A_e = a^T a / N``, ``G_e = N d^T d``; Conv2d ``A_e = sum p p^T / n``,
              ``G_e = B sum d d^T``; Embedding ``A_e = counts / N``, ``G_e = N d^T d`` (KFC).
            * ``"gpu"`` (MindSpore on GPU): Dense ``A_e = a^T a / in``, ``G_e = bs^2 / N d^T d``; Conv2d
              ``A_e = sum_t pm pm^T / sqrt(T)``, ``G_e = bs^2 / sqrt(T) sum_t dm dm^T`` (MindSpore's
              damping ``sqrt(d / T)`` and inverses times ``sqrt(1 / T)``, folded in); Embedding
              ``A_e = counts / bs``, ``G_e = bs^2 / N d^T d``.
            * ``"ascend"`` (MindSpore on Ascend): Dense ``A_e = a^T a / N``, ``G_e = bs^2 / N d^T d``;
              Conv2d, with ``c = n / bs``, ``A_e = sqrt(c) sum p p^T / n``, ``G_e = sqrt(c) bs^2 / n
              sum d d^T`` (MindSpore's damping ``sqrt(d bs / n)`` and product factor ``bs / n``,
              folded in); Embedding as gpu.
            * ``"auto"`` (default): ``"gpu"`` if MindSpore's ``device_target`` is GPU, ``"ascend"`` if
              Ascend, ``"kfc"`` on CPU (why: ``ms_optim._thor.conventions``).

            LayerNorm and everything else do not depend on it. The resolved value is the optimizer's
            ``factor_convention``.
        distribute_inverses (bool, keyword-only): under data parallelism with R > 1 ranks, each layer's
            inversion is done by one rank only (owners balanced by the cost ``sum w^3`` over the A and G
            blocks of width ``w``, greedy longest-processing-time, the same on every rank) and the inverses
            are shared by a summing AllReduce of zero-padded contributions, fused in the ``split_indices``
            groups: the same numbers, 1/R of the inversion work per rank (KAISA; ``ms_optim._thor.sharing``).
            Changes nothing on one device. Refused (ValueError) with a ``factor_convention`` that resolves to
            ``"gpu"`` or ``"ascend"``: those average each rank's own inverses, as MindSpore does
            (``ms_optim._thor.averaging``), so there is no identical inversion to share. Default: False.
        trace_thresholds (keyword-only): None (default: every layer re-inverted on every THOR step,
            MindSpore's THOR exactly), a number ``omega`` or a pair ``(omega_1, omega_2)``,
            ``omega_1 >= omega_2 >= 0``: THOR's trace rule; on a THOR step layer i is re-inverted only if the
            relative change ``Delta_i = |T_i - T_i^last| / T_i^last`` of ``T_i = tr(A) tr(G)`` since its last
            inversion is ``>= omega_1``, or ``>= omega_2`` once its interval (doubling after each such
            refresh) has elapsed (``ms_optim._thor.trace``: the rule, its state Parameters and the inversion
            counters).
        adapt_every (int, keyword-only): with ``damping="adaptive"``, steps between two damping adaptations
            (at least 1). Default: None (5, Martens & Grosse's and kfac-jax's interval).
        damping_bounds (keyword-only): with ``damping="adaptive"``, ``(low, high)``, ``0 < low <= high``: the
            range the damping is clipped to. Default: None (``(1e-8, 1e4)``).

    Returns:
        ThorOptimizer, a ``mindspore.nn.Optimizer``.

    Raises:
        TypeError: If `learning_rate` or `damping` is neither a Tensor nor a str; if
            `damping_bounds` is not None or a pair of numbers; if `adapt_every` is not an int.
        TypeError: If `momentum` is not a float or 'adaptive', `frequency` not an int, `batch_size` not an
            int or float, `loss_scale`, `weight_decay` or `kl_clip` (unless None) not a number,
            `use_nesterov` not a bool,
            `enable_clip_grad` not a bool or int,
            `decay_filter` not callable, `split_indices` not a list of ints, `net` not a Cell,
            `factor_convention` not a str, `distribute_inverses` not a bool, `trace_thresholds` not None,
            a number or a pair of numbers, `inverse` not a str.
        ValueError: If `factor_convention` is not 'auto', 'gpu', 'ascend' or 'kfc'; if `distribute_inverses`
            is True and `factor_convention` resolves to 'gpu' or 'ascend'.
        ValueError: If `loss_scale`, `batch_size` or `kl_clip` is not positive.
        ValueError: If `weight_decay` or `momentum` is less than 0; if `trace_thresholds` holds a NaN,
            infinite or negative number, is a sequence not of length 2, or has ``omega_1 < omega_2``.
        ValueError: If `momentum`, `weight_decay`, `loss_scale` or `kl_clip` is NaN, infinite or beyond
            float32.
        ValueError: If `frequency` is less than 2; if `frequency`, `batch_size` or `block_size` does not fit
            int32; if `batch_size` is a float with a fractional part.
        ValueError: If `learning_rate`/`damping` is empty, not 0-D/1-D, or holds a negative or
            non-finite value; in data-parallel training, if `split_indices` is not strictly increasing
            non-negative ints; if
            `net` has no layer THOR can precondition or no trainable parameter; if `net` is itself a
            bare plain layer (``nn.Dense``, ...), which cannot be replaced in place: wrap it in a Cell.
        ValueError: If `learning_rate` is a str other than 'adaptive'; if `learning_rate` is 'adaptive' and
            `use_nesterov` True or `momentum` 1.0 or more; if `momentum` is 'adaptive' and `learning_rate`
            is not.
        ValueError: If `damping` is a str other than 'adaptive'; if `adapt_every` or `damping_bounds` is given
            with a damping Tensor; if `adapt_every` is less than 1 or beyond int32; if `damping_bounds` is not
            ``(low, high)`` with ``0 < low <= high`` finite in float32; if `damping` is 'adaptive' and
            `use_nesterov` True.
        ValueError (at run time): If the step runs past the end of a `learning_rate` or `damping` Tensor.
        RuntimeError (when the step is compiled): If `learning_rate` or `damping` is 'adaptive' and the
            optimizer is stepped by a cell that does not run the extra forward pass (MindSpore's own
            ``nn.TrainOneStepCell``, or ``Model`` without ``ms_optim.use()``).

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> net = nn.SequentialCell([nn.Dense(4, 3)])
        >>> opt = nn.thor(net, ms.Tensor(0.1), ms.Tensor(0.03), 0.9, batch_size=8, frequency=10)
        >>> type(net[0]).__name__, opt.get_frequency()
        ('DenseThor', 10)
        >>> recipe_free = nn.thor(nn.SequentialCell([nn.Dense(4, 3)]), "adaptive", "adaptive", 0.9)
        >>> step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)  # ms_optim's cell
    """
    config = validate_thor(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size,
                           use_nesterov, decay_filter, split_indices, enable_clip_grad, frequency,
                           inverse=inverse, block_size=block_size, kl_clip=kl_clip,
                           factor_convention=factor_convention, distribute_inverses=distribute_inverses,
                           trace_thresholds=trace_thresholds, adapt_every=adapt_every,
                           damping_bounds=damping_bounds)
    return build_thor(net, config)
