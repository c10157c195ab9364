r"""THOR: ``thor()`` (MindSpore's signature) and the single optimizer Cell behind it, ``ThorOptimizer``.

One class for every device (CPU, GPU, Ascend); the device changes no code path. Built from
``mindspore.ops`` only; a ``mindspore.nn.Optimizer`` subclass over ``net.trainable_params()``, so
``Model``, ``TrainOneStepCell``, loss-scale cells and checkpoints work as with MindSpore's optimizers.

Algorithm (one call of the optimizer is one step ``t``, its ``global_step``; ``f = frequency``;
``lr`` and ``damping`` are 1-D Tensors indexed by ``t`` (a 0-D Tensor is the same value every step)):

.. code-block:: text

    g      <- grad / loss_scale                              for every trainable parameter
    lam    <- sqrt(damping[t])
    if t % f == 0:                                            # a "THOR step"
        for every THOR layer l (DenseThor, Conv2dThor, EmbeddingThor, in cells_and_names() order):
            A_l <- layer.matrix_a_cov                         # collected by the layer this step
            G_l <- layer.matrix_g_cov / factor_loss_scale**2    # the scale of THIS step's backward
        (A, G) <- FactorAllReduce(A), FactorAllReduce(G)      # mean over data-parallel ranks
        Ainv_l <- blockdiag_k (A_l,k + lam I)^-1              # 128-wide diagonal blocks (last smaller),
        Ginv_l <- blockdiag_k (G_l,k + lam I)^-1              # or the whole matrix (inverse="full")
        (embedding: Ainv_l <- 1 / (a_l + lam), a_l the diagonal of A)
    (other steps reuse the stored Ainv, Ginv: no factor work at all)
    Dense/Conv2d weight:   g <- Ginv g Ainv                   (conv weight as out x (in*kh*kw))
    Embedding table:       g <- diag(Ainv) g Ginv
    nn.LayerNorm gamma/beta: g <- g / (g^2 / batch_size + lam)
    everything else (biases, BatchNorm, ...): g unchanged
    if weight_decay > 0:   g <- g + weight_decay * w           where decay_filter(w)
    if enable_clip_grad:   g <- g / max(||g||_2, 1)            per tensor
    accum <- momentum * accum + g
    w     <- w - lr[t] * accum                                 (Nesterov: w <- w - lr[t] * (g + momentum * accum))
    t     <- t + 1;  every layer's thor_flag <- (t % f == 0)   # the layers collect A, G on the next step

The thor_flag write is what makes the schedule hold in every calling path (``TrainOneStepCell``,
``Model``, ``ModelThor`` with or without dataset sink) with no Python-side toggling. A step the
caller skips (loss-scale overflow: the optimizer is not called) changes nothing here: the
parameters, moments, inverses and ``global_step`` stay, and so do the flags, so the retried step
is again a THOR step if the skipped one was.

Loss scaling and G. A layer stores G from the gradient as it reaches the layer, i.e. multiplied by
the loss scale s of that backward pass, so G carries s**2. The optimizer divides it by the square of
``factor_loss_scale``, a non-trainable float32 Parameter (shape ()) holding the scale used in the
current backward pass; it starts at ``loss_scale`` (right for no scaling and for
``FixedLossScaleManager(drop_overflow_update=False)``, where ``TrainOneStepCell`` gets
``sens = loss_scale``). A loss-scale cell whose scale changes (``DynamicLossScaleManager``) must
feed the scale the gradients of this step were multiplied by, before the optimizer runs and before
the manager updates it: inside its ``construct``, ``optimizer.feed_loss_scale(scale)`` (an
``ops.assign``; ``ModelThor``'s loss-scale cell does it). MindSpore's own
``TrainOneStepWithLossScaleCell`` does not: with it the optimizer keeps ``loss_scale``, right only
while the live scale equals it (that cell does not run on CPU in MindSpore 2.10 anyway).

An inverse is accepted only if finite and accurate (see ``ms_optim.thor.preconditioner``); a
rejected factor keeps the layer's previous inverse (the identity before the first accepted one),
so a singular or non-finite factor never puts NaN into the parameters.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

import mindspore.common.dtype as mstype
from mindspore import Parameter, ParameterTuple, Tensor, jit, nn, ops
from mindspore.nn.optim.optimizer import Optimizer
from mindspore.ops import functional as F
from mindspore.ops import operations as P
from mindspore.ops import composite as C

from ms_optim._validation import (check_bool, check_callable, check_int, check_non_negative, check_number,
                                  check_positive, check_range, check_tensor, check_type, check_float,
                                  describe)
from ms_optim.thor import preconditioner as pc
from ms_optim.thor.layers import ThorLayer
from ms_optim.thor.parallel import FactorAllReduce

__all__ = ["thor", "ThorOptimizer", "count_thor_cells"]

_NAME = "thor"

# per-parameter treatment codes (Python constants: GRAPH_MODE unrolls the per-parameter loop)
_PLAIN = 0
_MATRIX = 1       # Dense / Conv2d weight: Ginv g Ainv
_EMBEDDING = 2    # embedding table: diag(Ainv) g Ginv
_LAYERNORM = 3    # LayerNorm gamma/beta

_apply_decay = C.MultitypeFuncGraph("thor_apply_decay")
_clip_to_unit_norm = C.MultitypeFuncGraph("thor_clip_to_unit_norm")
_momentum_step = C.MultitypeFuncGraph("thor_momentum_step")
_nesterov_step = C.MultitypeFuncGraph("thor_nesterov_step")


@_apply_decay.register("Tensor", "Bool", "Tensor", "Tensor")
def _apply_decay_tensor(weight_decay, decay, weight, gradient):
    """g + wd * w where the decay filter keeps the parameter."""
    if decay:
        return gradient + weight_decay * ops.cast(weight, F.dtype(gradient))
    return gradient


@_clip_to_unit_norm.register("Tensor")
def _clip_to_unit_norm_tensor(gradient):
    """Per-tensor clip to L2 norm 1: g / max(||g||, 1)."""
    norm = ops.sqrt(ops.reduce_sum(ops.square(ops.cast(gradient, mstype.float32))))
    scale = ops.cast(ops.reciprocal(ops.maximum(norm, 1.0)), F.dtype(gradient))
    return gradient * scale


@_momentum_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _momentum_step_tensor(opt, momentum, learning_rate, gradient, weight, moment):
    """accum = m * accum + g; w -= lr * accum (the fused ApplyMomentum kernel)."""
    return F.depend(True, opt(weight, moment, learning_rate, gradient, momentum))


@_nesterov_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _nesterov_step_tensor(momentum, learning_rate, gradient, weight, moment):
    """accum = m * accum + g; w -= lr * (g + m * accum).

    Written out because ``ApplyMomentum(use_nesterov=True)``'s CPU kernel in MindSpore 2.10 ignores
    the flag (it performs the plain momentum update).
    """
    gradient = ops.cast(gradient, F.dtype(moment))
    accum = momentum * moment + gradient
    done = ops.assign(moment, accum)
    update = ops.cast(learning_rate * (gradient + momentum * accum), F.dtype(weight))
    return F.depend(True, F.depend(ops.assign_sub(weight, update), done))


# ----------------------------------------------------------------------------------- validation
def _plain_convertible(cell: nn.Cell) -> bool:
    """Whether ``cell`` is a plain layer some THOR layer class converts (uses the layers' own rule)."""
    stack = list(ThorLayer.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        supports = getattr(cls, "supports", None)
        if supports is not None and getattr(cls, "kind", "") and supports(cell):
            return True
    return False


def count_thor_cells(net: nn.Cell) -> int:
    """Number of THOR layers ``net`` has, or will have once converted (the converter is not run)."""
    count = 0
    for _, cell in net.cells_and_names():
        if isinstance(cell, ThorLayer) or _plain_convertible(cell):
            count += 1
    return count


def _check_schedule(name: str, value: Any) -> Tensor:
    """A 0-D or non-empty 1-D Tensor of finite, non-negative numbers."""
    check_tensor(name, value, _NAME, ndims=(0, 1))
    if value.ndim == 1 and value.shape[0] == 0:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must not be empty, but got shape (0,).")
    array = value.asnumpy().astype(np.float64)
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        bad = array[~(np.isfinite(array) & (array >= 0))][0]
        raise ValueError(f"For '{_NAME}', the argument '{name}' must hold finite values >= 0, "
                         f"but got {float(bad)!r}.")
    return value


def _validate(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
              decay_filter, split_indices, enable_clip_grad, frequency, inverse, block_size) -> int:
    """Check every argument (nothing is modified); returns the number of THOR layers of ``net``."""
    check_type("net", net, nn.Cell, _NAME, what="a Cell")
    _check_schedule("learning_rate", learning_rate)
    _check_schedule("damping", damping)
    check_float("momentum", momentum, _NAME)
    check_non_negative("momentum", momentum, _NAME)
    check_number("weight_decay", weight_decay, _NAME)
    check_non_negative("weight_decay", weight_decay, _NAME)
    check_number("loss_scale", loss_scale, _NAME)
    check_positive("loss_scale", loss_scale, _NAME)
    check_int("batch_size", batch_size, _NAME)
    check_positive("batch_size", batch_size, _NAME)
    check_bool("use_nesterov", use_nesterov, _NAME)
    check_callable("decay_filter", decay_filter, _NAME)
    check_bool("enable_clip_grad", enable_clip_grad, _NAME)
    check_int("frequency", frequency, _NAME)
    check_range("frequency", frequency, low=2, cls_name=_NAME)
    if inverse not in ("blocked", "full"):
        raise ValueError(f"For '{_NAME}', the argument 'inverse' must be 'blocked' or 'full', "
                         f"but got {describe(inverse)}.")
    check_int("block_size", block_size, _NAME)
    check_positive("block_size", block_size, _NAME)
    num_layers = count_thor_cells(net)
    if num_layers == 0:
        raise ValueError(f"For '{_NAME}', the argument 'net' must contain at least one layer THOR can "
                         f"precondition (nn.Dense, nn.Conv2d with group 1, nn.Embedding or their THOR "
                         f"versions), but got {type(net).__name__} with none.")
    if split_indices is not None:
        check_type("split_indices", split_indices, (list, tuple), _NAME, what="a list of ints or None")
        for index in split_indices:
            check_int("split_indices", index, _NAME)
            if not 0 <= index < num_layers:
                raise ValueError(f"For '{_NAME}', the argument 'split_indices' must hold layer indices in "
                                 f"[0, {num_layers - 1}] (the net has {num_layers} THOR layers), "
                                 f"but got {list(split_indices)!r}.")
        if any(b <= a for a, b in zip(split_indices, split_indices[1:])):
            raise ValueError(f"For '{_NAME}', the argument 'split_indices' must be strictly increasing, "
                             f"but got {list(split_indices)!r}.")
    return num_layers


def _convert(net: nn.Cell) -> None:
    from ms_optim.thor.convert import ConvertNetUtils  # local: convert.py imports every layer class

    ConvertNetUtils().convert_to_thor_net(net)


# ----------------------------------------------------------------------------------- the optimizer
class ThorOptimizer(Optimizer):
    r"""THOR's optimizer Cell (built by :func:`thor`; see the module docstring for the update rule).

    Public attributes (stable; ``ModelThor`` and the benchmarks rely on them):

    * ``frequency`` (int) and ``get_frequency()``; ``global_step`` (int32 Parameter, shape (1,)): the
      step t; t is a THOR step iff ``t % frequency == 0``;
    * ``thor_cells`` (tuple of ``ThorLayer``), in ``net.cells_and_names()`` order; ``num_layers``;
    * ``matrix_a_inv`` / ``matrix_g_inv`` (ParameterTuples, names ``matrix_a_inv_blocks_<i>`` /
      ``matrix_g_inv_blocks_<i>``): the stored inverses, ``(nblocks, bs, bs)`` (embedding A:
      ``(vocab,)``); ``a_layouts`` / ``g_layouts``: their ``BlockLayout``\ s. (MindSpore calls its
      inverses ``matrix_a_inv_<i>`` with other, device-specific shapes -- 4-D on GPU, float16
      fractal blocks on Ascend; distinct names let a MindSpore THOR checkpoint load here without a
      shape clash: its inverses are skipped and recomputed on the next THOR step.)
    * ``factor_loss_scale`` (float32 Parameter, shape ()): the loss scale of the current backward
      pass, G is divided by its square; ``feed_loss_scale(scale)`` writes it (see the module
      docstring, "Loss scaling and G");
    * ``moments`` (``moments.<param name>``), ``momentum`` (Parameter), ``learning_rate`` (as
      ``nn.Optimizer``), ``damping`` (float32 Tensor), ``loss_scale``, ``batch_size``,
      ``weight_decay`` (float), ``decay_flags``, ``use_nesterov``, ``enable_clip_grad``,
      ``inverse`` (``"blocked"``/``"full"``), ``block_size``, ``split_indices``.
    """

    def __init__(self, net: nn.Cell, learning_rate: Tensor, damping: Tensor, momentum: float,
                 weight_decay: float = 0.0, loss_scale: float = 1.0, batch_size: int = 32,
                 use_nesterov: bool = False, decay_filter: Callable = lambda x: x.name not in [],
                 split_indices: Optional[Sequence[int]] = None, enable_clip_grad: bool = False,
                 frequency: int = 100, *, inverse: str = "blocked", block_size: int = 128):
        num_layers = _validate(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size,
                               use_nesterov, decay_filter, split_indices, enable_clip_grad, frequency, inverse,
                               block_size)
        _convert(net)
        params = net.trainable_params()
        if not params:
            raise ValueError(f"For '{_NAME}', the argument 'net' must have trainable parameters, but got none.")
        super().__init__(learning_rate, params, 0.0, float(loss_scale))
        self.frequency = int(frequency)
        self.batch_size = int(batch_size)
        self.use_nesterov = bool(use_nesterov)
        self.enable_clip_grad = bool(enable_clip_grad)
        self.inverse = inverse
        self.block_size = int(block_size)
        self.split_indices = list(split_indices) if split_indices is not None else None
        self.momentum = Parameter(Tensor(momentum, mstype.float32), name="momentum")
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.opt = P.ApplyMomentum()

        # weight decay: our own flags (nn.Optimizer's default filter would skip 'beta'/'gamma')
        self.weight_decay = float(weight_decay)
        self.apply_weight_decay = self.weight_decay > 0
        self.decay_flags = tuple(bool(decay_filter(p)) for p in self._parameters)
        self.weight_decay_tensor = Tensor(self.weight_decay, mstype.float32)
        self.exec_weight_decay = False  # nn.Optimizer's own decay path stays off

        # learning rate / damping schedules and their lengths (None: a 0-D Tensor, no end)
        self.lr_steps = int(learning_rate.shape[0]) if learning_rate.ndim == 1 else None
        self.damping = Tensor(damping.asnumpy().astype(np.float32).reshape(-1))
        self.damping_steps = int(damping.shape[0]) if damping.ndim == 1 else None
        self.damping_is_scalar = damping.ndim == 0

        self._find_layers(net, num_layers)
        self._map_parameters(net)
        self.reduce_a = FactorAllReduce(self.num_layers, self.split_indices)
        self.reduce_g = FactorAllReduce(self.num_layers, self.split_indices)
        self.factor_loss_scale = Parameter(Tensor(float(loss_scale), mstype.float32), name="factor_loss_scale",
                                           requires_grad=False)
        self.frequency_tensor = Tensor([self.frequency], mstype.int32)
        self.zero_step = Tensor([0], mstype.int32)
        self.one_step = Tensor([1], mstype.int32)
        self.lr_steps_tensor = Tensor([self.lr_steps or 0], mstype.int32)
        self.damping_steps_tensor = Tensor([self.damping_steps or 0], mstype.int32)
        self.sync_thor_flags()

    # ------------------------------------------------------------------ construction helpers
    def _find_layers(self, net: nn.Cell, num_layers: int) -> None:
        layers: List[ThorLayer] = [cell for _, cell in net.cells_and_names() if isinstance(cell, ThorLayer)]
        if len(layers) != num_layers:
            raise RuntimeError(f"For '{_NAME}', converting the net gave {len(layers)} THOR layers where "
                               f"{num_layers} were expected.")
        self.thor_cells = tuple(layers)
        self.num_layers = len(layers)
        block = self.block_size if self.inverse == "blocked" else None
        a_layouts, g_layouts, a_inv, g_inv = [], [], [], []
        for i, layer in enumerate(layers):
            g_layout = pc.BlockLayout(int(layer.g_dim), block)
            g_layouts.append(g_layout)
            g_inv.append(Parameter(Tensor(pc.identity_blocks(g_layout)), name=f"matrix_g_inv_blocks_{i}",
                                   requires_grad=False))
            if layer.kind == "embedding":
                a_layouts.append(None)
                a_inv.append(Parameter(Tensor(np.ones((int(layer.a_dim),), np.float32)),
                                       name=f"matrix_a_inv_blocks_{i}", requires_grad=False))
            else:
                a_layout = pc.BlockLayout(int(layer.a_dim), block)
                a_layouts.append(a_layout)
                a_inv.append(Parameter(Tensor(pc.identity_blocks(a_layout)), name=f"matrix_a_inv_blocks_{i}",
                                       requires_grad=False))
        self.a_layouts = tuple(a_layouts)
        self.g_layouts = tuple(g_layouts)
        self.matrix_a_inv = ParameterTuple(a_inv)
        self.matrix_g_inv = ParameterTuple(g_inv)
        self.matrix_a_cov = ParameterTuple([layer.matrix_a_cov for layer in layers])
        self.matrix_g_cov = ParameterTuple([layer.matrix_g_cov for layer in layers])
        self.thor_flags = ParameterTuple([layer.thor_flag for layer in layers])
        # static geometry and constants per layer, as tuples GRAPH_MODE reads by constant index
        self.layer_is_embedding = tuple(layer.kind == "embedding" for layer in layers)
        self.a_geom = tuple((lay.n, lay.nblocks, lay.bs) if lay is not None else (0, 0, 0) for lay in a_layouts)
        self.g_geom = tuple((lay.n, lay.nblocks, lay.bs) for lay in g_layouts)
        dummy = Tensor(np.zeros((1,), np.float32))
        self.a_eye = tuple(lay.eye if lay is not None else dummy for lay in a_layouts)
        self.a_pad_eye = tuple(lay.pad_eye if lay is not None else dummy for lay in a_layouts)
        self.g_eye = tuple(lay.eye for lay in g_layouts)
        self.g_pad_eye = tuple(lay.pad_eye for lay in g_layouts)

    def _map_parameters(self, net: nn.Cell) -> None:
        """Per trainable parameter: how its gradient is treated and which layer it belongs to."""
        role = {}
        for i, layer in enumerate(self.thor_cells):
            weight = layer.weight_param()
            role[id(weight)] = (_EMBEDDING if layer.kind == "embedding" else _MATRIX, i)
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.LayerNorm):
                for param in (cell.gamma, cell.beta):
                    role.setdefault(id(param), (_LAYERNORM, -1))
        kinds, owners = [], []
        # the weight gradient each layer's factor read waits for (the backward has stored G by then)
        layer_grad = [0] * self.num_layers
        for j, param in enumerate(self._parameters):
            kind, owner = role.get(id(param), (_PLAIN, -1))
            if kind in (_MATRIX, _EMBEDDING):
                layer = self.thor_cells[owner]
                expected = (layer.g_dim, layer.a_dim) if kind == _MATRIX else (layer.a_dim, layer.g_dim)
                rows, cols = int(param.shape[0]), int(np.prod(param.shape[1:]))
                if (rows, cols) != tuple(int(x) for x in expected):
                    raise RuntimeError(f"For '{_NAME}', the weight '{param.name}' of shape {tuple(param.shape)} "
                                       f"does not match its THOR factors (A {layer.a_dim}, G {layer.g_dim}).")
                layer_grad[owner] = j
            kinds.append(kind)
            owners.append(owner)
        self.param_kinds = tuple(kinds)
        self.param_layers = tuple(owners)
        self.layer_grad_index = tuple(layer_grad)

    # ------------------------------------------------------------------ public helpers
    def get_frequency(self) -> int:
        """The THOR frequency f: A, G and their inverses are recomputed on steps 0, f, 2f, ..."""
        return self.frequency

    def sync_thor_flags(self) -> None:
        """Set every layer's ``thor_flag`` to ``global_step % frequency == 0`` (host side).

        Called when the optimizer is built; call it after loading a checkpoint that holds the
        optimizer's ``global_step`` but not the net's flags (a checkpoint of the whole training
        cell holds both and needs nothing).
        """
        step = int(self.global_step.asnumpy().reshape(-1)[0])
        value = Tensor(np.array(step % self.frequency == 0))
        for flag in self.thor_flags:
            ops.assign(flag, value)  # in place: a compiled graph ignores set_data on Parameters it writes

    def feed_loss_scale(self, scale):
        """Write the loss scale this step's gradients (and so the layers' G) were multiplied by.

        Call it from a loss-scale training cell's ``construct``, with the scale read BEFORE the
        loss-scale manager updates it, and order it before the optimizer call (e.g.
        ``grads = ops.depend(grads, optimizer.feed_loss_scale(scale))``). ``scale``: a Tensor of
        shape () or (1,). Returns the result of the ``ops.assign``.
        """
        value = ops.cast(ops.reshape(scale, ()), mstype.float32)
        return ops.assign(self.factor_loss_scale, value)

    # ------------------------------------------------------------------ the step
    def _check_schedules(self, step):
        if self.lr_steps is not None:
            if ops.any(ops.ge(step, self.lr_steps_tensor)):
                raise ValueError(f"For 'thor', the argument 'learning_rate' holds {self.lr_steps} per-step "
                                 f"values, and the optimizer has run past its end; give a longer "
                                 f"'learning_rate' Tensor.")
        if self.damping_steps is not None:
            if ops.any(ops.ge(step, self.damping_steps_tensor)):
                raise ValueError(f"For 'thor', the argument 'damping' holds {self.damping_steps} per-step "
                                 f"values, and the optimizer has run past its end; give a longer "
                                 f"'damping' Tensor.")
        return step

    def _damping_at(self, step):
        if self.damping_is_scalar:
            return ops.reshape(self.damping, ())
        return ops.reshape(ops.gather(self.damping, step, 0), ())

    def _refresh_inverses(self, gradients, lam):
        """THOR step: read the layers' factors, all-reduce, invert (damped, blocked), store."""
        a_factors = ()
        g_factors = ()
        g_unscale = ops.reciprocal(ops.square(self.factor_loss_scale))
        for i in range(self.num_layers):
            anchor = gradients[self.layer_grad_index[i]]
            a_factors += (ops.depend(self.matrix_a_cov[i], anchor),)
            g_factors += (ops.depend(self.matrix_g_cov[i], anchor) * g_unscale,)
        a_factors = self.reduce_a(a_factors)
        g_factors = self.reduce_g(g_factors)
        done = ()
        for i in range(self.num_layers):
            if self.layer_is_embedding[i]:
                new_a = pc.damped_diagonal_inverse(a_factors[i], lam)
                ok_a = ops.all(ops.isfinite(new_a))
            else:
                geom = self.a_geom[i]
                blocks = pc.damped_blocks(a_factors[i], lam, geom[0], geom[1], geom[2], self.a_eye[i],
                                          self.a_pad_eye[i])
                new_a = pc.invert_blocks(blocks)
                ok_a = pc.accept_inverse(blocks, new_a, self.a_eye[i])
            geom = self.g_geom[i]
            blocks = pc.damped_blocks(g_factors[i], lam, geom[0], geom[1], geom[2], self.g_eye[i],
                                      self.g_pad_eye[i])
            new_g = pc.invert_blocks(blocks)
            ok_g = pc.accept_inverse(blocks, new_g, self.g_eye[i])
            done += (ops.assign(self.matrix_a_inv[i], ops.select(ok_a, new_a, self.matrix_a_inv[i])),)
            done += (ops.assign(self.matrix_g_inv[i], ops.select(ok_g, new_g, self.matrix_g_inv[i])),)
        return F.depend(gradients, done)

    def _precondition(self, gradients, lam):
        """Apply the stored inverses (Dense/Conv/Embedding) and the LayerNorm rule; others unchanged."""
        new_grads = ()
        for j in range(self.param_length):
            g = gradients[j]
            kind = self.param_kinds[j]
            i = self.param_layers[j]
            if kind == _MATRIX:
                shape = g.shape
                g2 = ops.reshape(ops.cast(g, mstype.float32), (shape[0], -1))
                g2 = pc.precondition_matrix(g2, self.matrix_g_inv[i], self.matrix_a_inv[i], self.g_geom[i],
                                            self.a_geom[i])
                g = ops.cast(ops.reshape(g2, shape), F.dtype(g))
            elif kind == _EMBEDDING:
                g32 = ops.cast(g, mstype.float32)
                g = ops.cast(pc.precondition_embedding(g32, self.matrix_a_inv[i], self.matrix_g_inv[i], self.g_geom[i]),
                             F.dtype(g))
            elif kind == _LAYERNORM:
                g = pc.precondition_layernorm(g, lam, float(self.batch_size))
            new_grads += (g,)
        return new_grads

    @jit(backend="ms_backend")
    def construct(self, gradients):
        params = self._parameters
        gradients = self.scale_grad(gradients)
        step = self._check_schedules(self.global_step)
        lam = ops.sqrt(self._damping_at(step))
        next_flag = ops.reshape(ops.equal(ops.floor_mod(step + self.one_step, self.frequency_tensor),
                                          self.zero_step), ())
        if ops.all(ops.equal(ops.floor_mod(step, self.frequency_tensor), self.zero_step)):
            gradients = self._refresh_inverses(gradients, lam)
        gradients = self._precondition(gradients, lam)
        if self.apply_weight_decay:
            gradients = self.hyper_map(F.partial(_apply_decay, self.weight_decay_tensor), self.decay_flags,
                                       params, gradients)
        if self.enable_clip_grad:
            gradients = self.hyper_map(_clip_to_unit_norm, gradients)
        lr = self.get_lr()
        if self.use_nesterov:
            success = self.hyper_map(F.partial(_nesterov_step, self.momentum, lr), gradients, params, self.moments)
        else:
            success = self.hyper_map(F.partial(_momentum_step, self.opt, self.momentum, lr), gradients, params,
                                     self.moments)
        success = F.depend(success, self.assignadd(self.global_step, self.global_step_increase_tensor))
        for i in range(self.num_layers):
            success = F.depend(success, ops.assign(self.thor_flags[i], next_flag))
        return success


def thor(net, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0, batch_size=32,
         use_nesterov=False, decay_filter=lambda x: x.name not in [], split_indices=None, enable_clip_grad=False,
         frequency=100, *, inverse="blocked", block_size=128):
    r"""THOR, the second-order optimizer, with the signature of MindSpore's THOR factory, on every backend.

    Validates every argument first (a refused call leaves ``net`` untouched), then converts ``net``
    in place (``nn.Dense``/``nn.Conv2d``/``nn.Embedding`` -> their THOR versions, which collect the
    factors A and G), then returns the optimizer Cell (:class:`ThorOptimizer`). The update rule is in
    this module's docstring: on steps ``0, f, 2f, ...`` the damped inverses
    ``(A + sqrt(damping[t]) I)^-1`` and ``(G + sqrt(damping[t]) I)^-1`` are recomputed; every step the
    weight gradients become ``G^-1 dW A^-1``, then weight decay, optional per-tensor clipping to
    norm 1 and momentum (``accum = m * accum + g; w -= lr[t] * accum``) follow.

    Args:
        net (Cell): the training network (converted in place).
        learning_rate (Tensor): per-step learning rates (1-D, indexed by the step) or one 0-D value.
        damping (Tensor): per-step damping (1-D) or one 0-D value; ``sqrt(damping)`` is added to the
            factors' diagonals.
        momentum (float): momentum, at least 0.0.
        weight_decay (int, float): L2 penalty ``wd * w`` added on parameters ``decay_filter`` keeps.
            Default: 0.0.
        loss_scale (int, float): the static loss scale the gradients carry (divided out). G is divided
            by the square of ``factor_loss_scale``, which starts at this value; a dynamic loss-scale
            cell feeds the live scale with ``feed_loss_scale`` (see :class:`ThorOptimizer`).
            Greater than 0. Default: 1.0.
        batch_size (int): the batch size B, used by the LayerNorm rule ``g / (g^2 / B + sqrt(damping))``.
            Default: 32.
        use_nesterov (bool): Nesterov momentum. Default: False.
        decay_filter (function): parameter -> bool, which parameters get weight decay.
            Default: all of them.
        split_indices (list[int]): data-parallel all-reduce groups of the factors, split after these
            layer indices (strictly increasing, in [0, number of THOR layers - 1]). Default: None
            (one group).
        enable_clip_grad (bool): clip every preconditioned gradient to L2 norm 1. Default: False.
        frequency (int): recompute factors and inverses every ``frequency`` steps; at least 2.
            Default: 100.
        inverse (str, keyword-only): ``"blocked"`` (diagonal blocks of ``block_size``, the default on
            every device, as MindSpore's GPU and Ascend kernels) or ``"full"`` (whole-matrix inverses).
        block_size (int, keyword-only): width of the diagonal blocks. Default: 128.

    Returns:
        ThorOptimizer, a ``mindspore.nn.Optimizer``.

    Raises:
        TypeError: If `learning_rate` or `damping` is not a Tensor.
        TypeError: If `momentum` is not a float, `frequency` or `batch_size` not an int, `loss_scale`
            or `weight_decay` not a number, `use_nesterov` or `enable_clip_grad` not a bool,
            `decay_filter` not callable, `split_indices` not a list of ints, `net` not a Cell.
        ValueError: If `loss_scale` or `batch_size` is not positive.
        ValueError: If `weight_decay` or `momentum` is less than 0.
        ValueError: If `frequency` is less than 2.
        ValueError: If `learning_rate`/`damping` is empty, not 0-D/1-D, or holds a negative or
            non-finite value; if `split_indices` is not strictly increasing valid layer indices; if
            `net` has no layer THOR can precondition.
        ValueError (at run time): If the step runs past the end of `learning_rate` or `damping`.
    """
    return ThorOptimizer(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
                         decay_filter, split_indices, enable_clip_grad, frequency, inverse=inverse,
                         block_size=block_size)
