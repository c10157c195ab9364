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

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.net.convert import convert_net
from ms_optim._thor.net.taps import ScheduleGuard, TapSettings
from ms_optim._thor.step.optimizer import ThorOptimizer
from ms_optim._thor.validate import validate_thor

__all__ = ["thor", "build_thor"]

_NAME = "thor"


def build_thor(net: nn.Cell, config: ThorConfig) -> ThorOptimizer:
    """Convert ``net`` in place for ``config`` (every layer built with its convention, block width, schedule
    guard and shared tap) and build the optimizer (``config`` already validated)."""
    limits = config.schedule_limits
    # PYNATIVE: a step past the schedules' end, or a measured step no training cell measures, is refused
    # before the backward pass writes the factors; the guard is bound once the optimizer exists
    guarded = bool(limits) or config.measures_loss
    guard = ScheduleGuard(_NAME, Parameter(Tensor(np.zeros((1,), np.int32)), name="global_step"),
                          limits) if guarded else None
    settings = TapSettings(config.factor_convention, config.batch_size, config.factor_block_size, guard)
    layers = convert_net(net, settings)  # thor_candidates' layers: the rule the validation counted with
    optimizer = ThorOptimizer(net, layers, config)
    if guard is not None:
        guard.bind(optimizer)
    return optimizer


def thor(net, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0, batch_size=32,
         use_nesterov=False, decay_filter=lambda x: x.name not in [], split_indices=None,
         enable_clip_grad=False, frequency=100, *, inverse="blocked", block_size=128, kl_clip=None,
         factor_convention="auto", distribute_inverses=False, trace_thresholds=None, adapt_every=None,
         damping_bounds=None):
    r"""THOR, the second-order optimizer, with the signature of MindSpore's THOR factory, on every backend.

    Converts ``net`` in place (every trainable ``nn.Dense``, ``nn.Conv2d`` of group 1 and ``nn.Embedding``
    becomes its THOR layer, which collects the Kronecker factors :math:`A` and :math:`G` of its block of the
    Fisher matrix; ``nn.Conv1d`` too under ``factor_convention="kfc"``) and returns the optimizer. Every
    argument is checked first: a refused call leaves ``net`` untouched.

    On a THOR step, :math:`t \bmod f = 0` with :math:`f` = ``frequency``, every layer's factors are inverted
    with the damping :math:`\gamma_t = \sqrt{d_t}`; every step then preconditions each layer's weight
    gradient :math:`g` (divided by the loss scale) and applies weight decay and momentum:

    .. math::
        \hat A^{-1} = (A + \gamma_t I)^{-1}, \qquad \hat G^{-1} = (G + \gamma_t I)^{-1}, \qquad
        u = \hat G^{-1} g\, \hat A^{-1} + \lambda_w w, \qquad
        v \leftarrow \mu v + u, \qquad w \leftarrow w - \eta_t v

    with, for a Dense layer under ``"kfc"``, :math:`A = \frac{1}{N}\sum_n a_n a_n^{\top}` (its :math:`N`
    input rows) and :math:`G = N \sum_n D_n D_n^{\top}` (:math:`D = \partial L / \partial s`, the gradient of
    its output). :ref:`thor-algorithm` has the factors of every layer kind, the block-diagonal inverses, the
    Embedding and LayerNorm rules and gradient clipping; the options below link to their own sections. The
    algorithm is Chen et al., `THOR: Trace-based Hardware-driven Layer-Oriented Natural Gradient Descent
    Computation <https://www.aaai.org/AAAI21Papers/AAAI-6611.ChenM.pdf>`_ (AAAI 2021), of the K-FAC family
    (Martens and Grosse, `Optimizing Neural Networks with Kronecker-factored Approximate Curvature
    <https://arxiv.org/abs/1503.05671>`_, ICML 2015).

    Args:
        net (Cell): the training network (converted in place).
        learning_rate (Union[Tensor, str]): :math:`\eta_t`: per-step learning rates (1-D, indexed by the
            step) or one 0-D value. Or ``"adaptive"``: no schedule; the step size comes from THOR's quadratic
            model, calibrated on each batch by one extra forward pass of the training cell
            (:ref:`thor-adaptive-lr`).
        damping (Union[Tensor, str]): :math:`d_t`: per-step damping (1-D) or one 0-D value. Or
            ``"adaptive"``: no schedule; every step measured by an extra forward pass of the training
            cell, a step that raised the loss or overshot taken back with the damping raised, and a
            Levenberg-Marquardt rule on the reduction ratio every ``adapt_every`` steps
            (:ref:`thor-adaptive-damping`).
        momentum (Union[float, str]): :math:`\mu`, at least 0.0; below 1.0 with ``learning_rate="adaptive"``,
            where it may also be ``"adaptive"`` (chosen by the quadratic model each step).
        weight_decay (Union[int, float]): :math:`\lambda_w`, added to the preconditioned gradient of the
            parameters ``decay_filter`` keeps. Default: 0.0.
        loss_scale (Union[int, float]): the static loss scale the gradients carry, divided out
            (:ref:`thor-loss-scaling`). Greater than 0. Default: 1.0.
        batch_size (int): the batch size of the LayerNorm rule and of the ``"gpu"``/``"ascend"``
            normalisations (a float with a whole value is taken as that int, as MindSpore's thor takes it).
            Default: 32.
        use_nesterov (bool): Nesterov momentum. Default: False.
        decay_filter (function): parameter -> bool, which parameters get weight decay. Default: all of them.
        split_indices (list[int]): data-parallel all-reduce groups of the factors, split after these layer
            indices (strictly increasing; an index past the last THOR layer splits nothing and is ignored with
            a warning). Read only in data-parallel training, as MindSpore's. Default: None (one group).
        enable_clip_grad (bool): clip every preconditioned gradient to L2 norm 1 (an int counts as its truth
            value, as in MindSpore's thor). Default: False.
        frequency (int): :math:`f`: recompute the factors and their inverses every ``frequency`` steps; at
            least 2. Default: 100.
        inverse (str): keyword-only. ``"blocked"`` (diagonal blocks of ``block_size``, as MindSpore's GPU and
            Ascend kernels; the default on every device) or ``"full"`` (whole-matrix inverses).
        block_size (int): keyword-only. The width of the diagonal blocks. Default: 128.
        kl_clip (float): keyword-only. None (no clipping: MindSpore's THOR) or :math:`c > 0`: KL clipping
            of the preconditioned gradients (:ref:`thor-kl-clip`); with ``learning_rate="adaptive"``, the
            trust region of its step. Default: None.
        factor_convention (str): keyword-only. How :math:`A`, :math:`G` and the damping are normalised:
            ``"kfc"``, MindSpore's ``"gpu"`` or ``"ascend"`` (one table: :ref:`thor-conventions`), or
            ``"auto"``: ``"gpu"`` if MindSpore's ``device_target`` is GPU, ``"ascend"`` on Ascend, ``"kfc"``
            on CPU. The resolved value is the optimizer's ``factor_convention``. Default: ``"auto"``.
        distribute_inverses (bool): keyword-only. In data-parallel training, each layer is inverted by one
            rank and the inverses are shared: the same numbers, 1/R of the inversion work per rank
            (:ref:`thor-distribute-inverses`). Refused with the ``"gpu"`` and ``"ascend"`` conventions.
            Default: False.
        trace_thresholds (Union[float, tuple[float, float]]): keyword-only. None (every layer re-inverted on
            every THOR step: MindSpore's THOR), :math:`\omega` or :math:`(\omega_1, \omega_2)` with
            :math:`\omega_1 \ge \omega_2 \ge 0`: THOR's trace rule, which re-inverts only the layers whose
            Fisher block changed (:ref:`thor-trace`). Default: None.
        adapt_every (int): keyword-only. With ``damping="adaptive"``, the steps between two
            Levenberg-Marquardt adaptations (at least 1). Default: None (5).
        damping_bounds (tuple[float, float]): keyword-only. With ``damping="adaptive"``, ``(low, high)``,
            :math:`0 < \text{low} \le \text{high}`: the range of the damping. Default: None (``(1e-8, 1e4)``).

    Returns:
        Optimizer: a ``mindspore.nn.Optimizer`` over ``net.trainable_params()``, so ``Model``, training cells,
        loss-scale managers and checkpoints work as with MindSpore's optimizers. Besides ``nn.Optimizer``'s:
        ``get_frequency()``; ``factor_convention``; ``feed_loss_scale(scale)``, by which a training cell with
        a dynamic loss scale passes the scale of the step's backward pass (ms_optim's cells do); with
        ``trace_thresholds``, ``trace.inversions`` (the inversions per layer). With ``learning_rate`` or
        ``damping`` ``"adaptive"``, train it with :class:`ms_optim.nn.TrainOneStepCell`,
        :class:`ms_optim.nn.TrainOneStepWithLossScaleCell`, ``ModelThor`` or MindSpore's ``Model`` under
        ``ms_optim.use()``: they run its extra forward pass.

    Raises:
        TypeError: If `learning_rate` or `damping` is neither a Tensor nor a str; if
            `damping_bounds` is not None or a pair of numbers; if `adapt_every` is not an int.
        TypeError: If `momentum` is not a float or 'adaptive', `frequency` not an int, `batch_size` not an
            int or float, `loss_scale`, `weight_decay` or `kl_clip` (unless None) not a number,
            `use_nesterov` not a bool, `enable_clip_grad` not a bool or int, `decay_filter` not callable,
            `split_indices` not a list of ints, `net` not a Cell, `factor_convention` not a str,
            `distribute_inverses` not a bool, `trace_thresholds` not None, a number or a pair of numbers,
            `inverse` not a str.
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
            non-negative ints; if `net` has no layer THOR can precondition or no trainable parameter; if
            `net` is itself a bare plain layer (``nn.Dense``, ...), which cannot be replaced in place: wrap
            it in a Cell.
        ValueError: If `learning_rate` is a str other than 'adaptive'; if `learning_rate` is 'adaptive' and
            `use_nesterov` True or `momentum` 1.0 or more; if `momentum` is 'adaptive' and `learning_rate`
            is not.
        ValueError: If `damping` is a str other than 'adaptive'; if `adapt_every` or `damping_bounds` is given
            with a damping Tensor; if `adapt_every` is less than 1 or beyond int32; if `damping_bounds` is not
            ``(low, high)`` with ``0 < low <= high`` finite in float32; if `damping` is 'adaptive' and
            `use_nesterov` True.
        ValueError: At run time, if the step runs past the end of a `learning_rate` or `damping` Tensor.
        RuntimeError: When the step is compiled, if `learning_rate` or `damping` is 'adaptive' and the
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
