"""Adaptive THOR's extra forward pass in ms_optim's training cells (``ms_optim.loss_scale``).

A THOR optimizer with ``learning_rate`` or ``damping`` "adaptive" (``measures_loss``) needs the loss on the
step's batch after its update: :class:`LossProbe` runs the network once more and hands both losses to the
optimizer's ``finish_step``; :class:`LossAndGrads` gives the step's loss from the gradient's own forward pass;
:class:`_TwoGraphs` runs such a step as two graphs when the cell is called in GRAPH_MODE.
"""
from __future__ import annotations

import os

from mindspore import Parameter, ParameterTuple, context, nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.step.optimizer import ThorOptimizer

__all__ = ["LossProbe", "LossAndGrads", "loss_probe_for", "measures_loss"]


def measures_loss(optimizer) -> bool:
    """Whether ``optimizer`` is a THOR whose steps need the loss after them on their batch (``learning_rate``
    or ``damping`` "adaptive")."""
    return isinstance(optimizer, ThorOptimizer) and optimizer.measures_loss


class _ParsedMode(nn.Cell):
    """``in_graph``, read when the graph is parsed: a property of a base class, which MindSpore's parser
    evaluates in Python and puts in the graph as a constant."""

    @property
    def in_graph(self) -> bool:
        """Whether the cell runs compiled (GRAPH_MODE)."""
        return context.get_context("mode") != context.PYNATIVE_MODE


class LossProbe(_ParsedMode):
    """The extra forward pass after a THOR optimizer that measures its steps: on the steps the optimizer's
    ``probe_due`` names, the loss on the step's inputs at the parameters the optimizer left, handed with the
    step's loss to its ``finish_step``.

    Args:
        network (Cell): the network with its loss (the training cell's ``network``).
        optimizer (ThorOptimizer): the optimizer (``measures_loss``).

    Inputs: ``(loss, *inputs)``, the step's loss (ordered after the optimizer) and inputs. Output: ``loss``,
    ordered after the finish.

    The running statistics the forward pass writes (every sub-Cell's ``moving_mean`` and ``moving_variance``
    Parameters: BatchNorm's) are put back after it, so they take each batch once, from the step's own forward
    pass, as with any other optimizer (and a rejected trial leaves no trace in them).

    In GRAPH_MODE the probe's forward is the value of ``ops.value_and_grad``, whose gradients nothing reads
    (so only its forward pass runs): a plain call of the network next to the step's gradient makes MindSpore
    2.10 fail to compile some networks ("Illegal AnfNode for evaluating", e.g. a masked-LM gather at
    ``arange(batch) * seq`` offsets).
    """

    def __init__(self, network: nn.Cell, optimizer):
        super().__init__(auto_prefix=False)  # the network's and optimizer's parameter names stay as they are
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.running = running_statistics(network)
        self.hyper_map = ops.HyperMap()

    def probe_loss(self, *inputs):
        """The network's loss on ``inputs`` (a forward pass in training mode)."""
        if self.in_graph:
            return ops.value_and_grad(self.network, None, self.weights)(*inputs)[0]
        return self.network(*inputs)

    def construct(self, loss, *inputs):
        if self.optimizer.probe_due(ops.depend(self.optimizer.global_step, loss)):
            first = ops.depend(inputs[0], loss)  # the forward reads the parameters the optimizer left
            if self.running:  # ... and the running statistics after their copy, which it leaves as they were
                # a real copy: a multiply by one would be folded to the Parameter's own memory in GRAPH_MODE
                saved = self.hyper_map(ops.deepcopy, self.running)
                after = self.probe_loss(ops.depend(first, saved), *inputs[1:])
                after = ops.depend(after, self.hyper_map(ops.assign, self.running, F.depend(saved, after)))
            else:
                after = self.probe_loss(first, *inputs[1:])
            loss = ops.depend(loss, self.optimizer.finish_step(loss, after))
        return loss


def running_statistics(network: nn.Cell) -> ParameterTuple:
    """The running statistics a forward pass of ``network`` in training mode writes: the ``moving_mean`` and
    ``moving_variance`` Parameters of its sub-Cells (BatchNorm's), each once."""
    found, seen = [], set()
    for _, cell in network.cells_and_names():
        for attribute in ("moving_mean", "moving_variance"):
            parameter = getattr(cell, attribute, None)
            if isinstance(parameter, Parameter) and id(parameter) not in seen:
                seen.add(id(parameter))
                found.append(parameter)
    return ParameterTuple(found)


def loss_probe_for(network: nn.Cell, optimizer) -> "LossProbe | None":
    """A :class:`LossProbe` when ``optimizer`` measures its steps (marking it ``probed``: its step then
    compiles), else None."""
    if not measures_loss(optimizer):
        return None
    optimizer.probed = True
    return LossProbe(network, optimizer)


class _ScaledLoss(nn.Cell):
    """``(loss * scale, loss)`` from one forward pass of ``network``."""

    def __init__(self, network: nn.Cell):
        super().__init__(auto_prefix=False)  # the network's parameter names stay as they are
        self.network = network

    def construct(self, inputs, scale):
        loss = self.network(*inputs)
        return loss * ops.cast(scale, ops.dtype(loss)), loss


class LossAndGrads(nn.Cell):
    """The step's loss and the gradients of ``weights`` from ONE forward pass, for the training cells that run
    :class:`LossProbe`.

    MindSpore's cells call ``loss = network(*inputs)`` and then differentiate ``network`` again; in GRAPH_MODE
    MindSpore reuses the first call's forward inside the gradient's only while the network is called nowhere
    else in the step, and the probe is another call. Here the loss is the gradient's own forward output, so a
    step runs the forward twice (this one and the probe's), not three times.

    Args:
        network (Cell): the network with its loss.
        weights (ParameterTuple): the parameters to differentiate.

    Inputs: ``(scale, *inputs)``: the scale the loss's gradient is seeded with (a float32 Tensor) and the
    network's inputs. Outputs: ``(loss, grads)``.
    """

    def __init__(self, network: nn.Cell, weights):
        super().__init__(auto_prefix=False)
        self.scaled = _ScaledLoss(network)
        self.weights = weights

    def construct(self, scale, *inputs):
        (_, loss), grads = ops.value_and_grad(self.scaled, None, self.weights, has_aux=True)(inputs, scale)
        return loss, grads


class _OptimizerPart(nn.Cell):
    """The first graph of :class:`_TwoGraphs`: the training cell's ``_optimizer_part``."""

    def __init__(self, owner):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "owner", owner)  # not a child: the cell tree and names stay the owner's

    def construct(self, *inputs):
        return self.owner._optimizer_part(*inputs)


class _ProbePart(nn.Cell):
    """The second graph of :class:`_TwoGraphs`: the training cell's ``_probe_part``."""

    def __init__(self, owner):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "owner", owner)

    def construct(self, *args):
        count = self.owner._carried_count
        return self.owner._probe_part(args[:count], *args[count:])


class _TwoGraphs:
    """A training cell with a :class:`LossProbe`, called from Python in GRAPH_MODE, runs its step as two
    graphs: ``_optimizer_part(*inputs)`` (the loss, the gradients and the optimizer; returns what the probe
    needs, ``carried``) and ``_probe_part(carried, *inputs)`` (the extra forward pass and the optimizer's
    finish; returns the cell's output). ``construct`` is the two in one graph: what runs in PYNATIVE_MODE,
    inside another cell's graph, and with MindSpore's graceful exit.

    Why: a Parameter read in a graph that also writes it after another read (the step's forward pass, then
    the optimizer, then the probe's forward pass) makes MindSpore copy it before each read (a ``TensorMove``
    of every weight, twice per step); in two graphs each weight is read once per graph, as in a plain
    training step. Same numbers either way.

    The second graph takes the ``_carried_count`` Tensors of ``carried`` as arguments of their own (a tuple
    argument would be a constant of the graph: compiled anew every step). ``compile(*inputs)`` compiles both
    graphs (the second with placeholders of ``carried``: a mismatch only recompiles it on the first step).
    ``_graph_cells`` are the two graphs' cells (``()`` when the step is one graph always; ``_memory`` wraps
    their compilation too); ``_graph_parts()`` the ones that run now.
    """

    def _set_parts(self, usable: bool) -> None:
        """Make the two graph cells when ``usable`` and the cell's class keeps the ``construct`` its ms_optim
        class names as ``_two_graph_construct`` (a subclass with a ``construct`` of its own runs it, as one
        graph)."""
        own = type(self).construct is type(self)._two_graph_construct
        parts = (_OptimizerPart(self), _ProbePart(self)) if usable and own else ()
        object.__setattr__(self, "_graph_cells", parts)

    def _graph_parts(self) -> tuple:
        """The two graph cells when the step runs as two graphs now, else ``()``."""
        parts = self._graph_cells
        if not parts or self.use_graceful_exit or context.get_context("mode") != context.GRAPH_MODE \
                or os.getenv("MS_JIT") == "0":
            return ()
        for part in parts:
            if part.training != self.training:
                part.set_train(self.training)
        return parts

    def compile(self, *args, **kwargs):
        """Compile the training step for ``args`` (the network's inputs), as ``mindspore.nn.Cell.compile``.

        With a THOR optimizer whose ``learning_rate`` or ``damping`` is "adaptive", called in GRAPH_MODE, the
        step runs as two graphs, the optimizer's and its extra forward pass's: both are compiled (the second
        for a float32 loss; another loss type compiles it again on the first step). Any other cell compiles
        its one graph, as MindSpore's.
        """
        parts = self._graph_parts()
        if not parts or kwargs:
            return super().compile(*args, **kwargs)
        parts[0].compile(*args)
        return parts[1].compile(*self._carried_placeholder(), *args)

    def __call__(self, *args, **kwargs):
        parts = self._graph_parts()
        if not parts or kwargs:
            return super().__call__(*args, **kwargs)
        return parts[1](*parts[0](*args), *args)
