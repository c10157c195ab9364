"""One table of ms_optim's optimizers for the generic tests (torch's OptimizerInfo style).

Per optimizer: how to build it (the first-order ones on a list of Parameters or groups; THOR, which
converts the net's layers, on a net), its expected public signature (MindSpore 2.10's documented one;
MindSpore's own classes hide it behind a decorator), argument sets that must be accepted, argument sets
that must be refused (exception type, the argument the message must name, and the received value it
must show), the prefixes of its state Parameters, and for the first-order ones a float64 reference of
their update for the numeric generic tests (THOR's oracle runs are in tests/thor/).

Every "Raises" line of MindSpore's documentation for Lamb, LARS, ASGD and thor is a row of ``bad`` (plus
ms_optim's clearer errors where MindSpore fails badly: ``LARS("sgd")``, ``lars_filter=3``, negative
``lambd``/``alpha``; and for thor its whole table, which tests/thor/test_thor_validation.py also runs
on an unconverted net). A learning-rate list shorter than the steps trained is tested per optimizer in
tests/optim/test_optim_generic.py (it can only fail at run time).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn
from reference.asgd_ref import ASGDReference
from reference.lamb_ref import LambReference, centralize
from reference.lars_ref import LarsReference, MomentumReference

import ms_optim
from support.refusals import INF, Bad, asgd_bad, lamb_bad, lars_bad, thor_bad

EMPTY = inspect.Parameter.empty


def _lars_filter_default(param: Parameter) -> bool:
    """MindSpore's documented default ``lars_filter``: no LARS for LayerNorm parameters and biases."""
    return "LayerNorm" not in param.name and "bias" not in param.name


def two_params() -> List[Parameter]:
    """What the first-order optimizers' argument sets are built on: ``w`` (2, 3) and ``b`` (3,)."""
    return [Parameter(Tensor(np.ones((2, 3), np.float32)), name="w"),
            Parameter(Tensor(np.ones(3, np.float32)), name="b")]


class TwoDense(nn.Cell):
    """Dense(4 -> 8) -> ReLU -> Dense(8 -> 3): the net of the generic training tests, and what THOR's
    argument sets are built on."""

    def __init__(self):
        super().__init__()
        self.dense1 = nn.Dense(4, 8)
        self.relu = nn.ReLU()
        self.dense2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.dense2(self.relu(self.dense1(x)))


@dataclass
class OptimInfo:
    """What the generic tests need to know about one optimizer."""
    name: str
    cls: Callable[..., nn.Optimizer]                 # the public class or factory (ms_optim.nn.<name>)
    mindspore_cls: Callable[..., Any]                # mindspore.nn.<name>, for its documented signature
    signature: List[Tuple[str, Any]]                 # (argument, default) in order; EMPTY = required
    make: Callable[..., nn.Optimizer]                # make(target, learning_rate, weight_decay, **hyper)
    good: List[Dict[str, Any]]                       # keyword sets make() must accept
    bad: List[Bad]                                   # argument sets the class must refuse
    state_prefixes: Tuple[str, ...]                  # names of state Parameters start with these
    hyper: Dict[str, Any] = field(default_factory=dict)  # hyper-parameters for the numeric runs
    reference: Optional[Callable[..., Any]] = None   # reference(arrays, names, centralize_flags, **hyper)
    centralization: bool = True                      # numeric runs may use grad_centralization groups
    takes_params: bool = True                        # make's target: Parameters/groups (else a net: THOR)
    extensions: Tuple[str, ...] = ()                 # keyword-only arguments ms_optim adds after MindSpore's

    def __repr__(self) -> str:  # readable pytest ids
        return self.name

    def target(self):
        """A fresh target for the argument sets: ``two_params()``, or a ``TwoDense`` net for THOR."""
        return two_params() if self.takes_params else TwoDense()

    def make_for_net(self, net, **kwargs) -> nn.Optimizer:
        """The optimizer training ``net``: on its trainable Parameters, or on the net itself (THOR)."""
        return self.make(net.trainable_params() if self.takes_params else net, **kwargs)


class _CentralizeFirst:
    """A reference whose optimizer centralizes raw gradients before its rule (Lamb)."""

    def __init__(self, ref, flags: Sequence[bool]):
        self.ref, self.flags = ref, list(flags)

    @property
    def w(self):
        return self.ref.w

    def step(self, grads, lrs, wds):
        grads = [centralize(np.asarray(g, np.float64)) if f else g for g, f in zip(grads, self.flags)]
        return self.ref.step(grads, lrs, wds)


# ---- Lamb -------------------------------------------------------------------------------------------

def _make_lamb(params, learning_rate=0.05, weight_decay=0.0, **hyper):
    return ms_optim.nn.Lamb(params, learning_rate, weight_decay=weight_decay, **hyper)


def _ref_lamb(arrays, names, centralize_flags, beta1=0.9, beta2=0.999, eps=1e-6):
    return _CentralizeFirst(LambReference(arrays, beta1, beta2, eps), centralize_flags)


# ---- LARS (around MindSpore's Momentum) -------------------------------------------------------------

def _make_lars(params, learning_rate=0.05, weight_decay=0.0, momentum=0.9, **hyper):
    inner = nn.Momentum(params, learning_rate, momentum, weight_decay=weight_decay)
    return ms_optim.nn.LARS(inner, **hyper)


def _ref_lars(arrays, names, centralize_flags, momentum=0.9, epsilon=1e-5, coefficient=0.001, use_clip=False):
    keep = [_lars_filter_default(Parameter(Tensor(np.zeros(1, np.float32)), name=n)) for n in names]
    return LarsReference(MomentumReference(arrays, momentum), keep, coefficient, epsilon, use_clip)


# ---- ASGD -------------------------------------------------------------------------------------------

def _make_asgd(params, learning_rate=0.05, weight_decay=0.0, **hyper):
    return ms_optim.nn.ASGD(params, learning_rate, weight_decay=weight_decay, **hyper)


def _ref_asgd(arrays, names, centralize_flags, lambd=1e-4, alpha=0.75, t0=1e6):
    return ASGDReference(arrays, lambd, alpha, t0, centralize_flags)


# ---- THOR (a factory: converts the net's layers, then builds the optimizer) -------------------------

def _tensor(value) -> Tensor:
    """thor() takes its learning rate and damping as Tensors: a number -> 0-D, a list -> 1-D (per step)."""
    return value if isinstance(value, Tensor) else Tensor(np.asarray(value, np.float32))


def _make_thor(net, learning_rate=0.05, weight_decay=0.0, damping=0.03, momentum=0.9, **hyper):
    return ms_optim.nn.thor(net, _tensor(learning_rate), _tensor(damping), momentum, weight_decay, **hyper)


OPTIMIZERS: List[OptimInfo] = [
    OptimInfo(
        name="Lamb", cls=ms_optim.nn.Lamb, mindspore_cls=nn.Lamb,
        signature=[("params", EMPTY), ("learning_rate", EMPTY), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-6),
                   ("weight_decay", 0.0)],
        make=_make_lamb,
        good=[{}, {"beta1": 0.5, "beta2": 0.9, "eps": 1e-8}, {"learning_rate": 1}, {"weight_decay": 0},
              {"learning_rate": Tensor(0.1)}, {"learning_rate": [0.1, 0.05]}, {"weight_decay": nn.Dense(1, 1)},
              {"learning_rate": (x / 10 for x in range(1, 4))}],  # a generator, read once
        bad=lamb_bad(), state_prefixes=("lamb_m.", "lamb_v."),
        hyper={"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}, reference=_ref_lamb),
    OptimInfo(
        name="LARS", cls=ms_optim.nn.LARS, mindspore_cls=nn.LARS,
        signature=[("optimizer", EMPTY), ("epsilon", 1e-05), ("coefficient", 0.001), ("use_clip", False),
                   ("lars_filter", _lars_filter_default)],
        make=_make_lars,
        good=[{}, {"epsilon": 0.0, "coefficient": 0.01}, {"use_clip": True}, {"lars_filter": lambda p: True},
              {"learning_rate": [0.1, 0.05]}, {"momentum": 0.0}, {"coefficient": 0.0}],
        bad=lars_bad(), state_prefixes=("moments.",),
        hyper={"momentum": 0.9, "coefficient": 0.02, "epsilon": 1e-5}, reference=_ref_lars,
        centralization=False),  # the wrapped nn.Momentum centralizes with a primitive CPU lacks
    OptimInfo(
        name="ASGD", cls=ms_optim.nn.ASGD, mindspore_cls=nn.ASGD,
        signature=[("params", EMPTY), ("learning_rate", 0.1), ("lambd", 1e-4), ("alpha", 0.75), ("t0", 1e6),
                   ("weight_decay", 0.0)],
        make=_make_asgd,
        good=[{}, {"lambd": 0.0, "alpha": 0.0, "t0": -1.0}, {"learning_rate": 0}, {"weight_decay": 1},
              {"learning_rate": Tensor([0.1, 0.2])}, {"t0": INF}],  # t0 = inf: never average
        bad=asgd_bad(), state_prefixes=("ax_.", "mu_", "eta_"),
        hyper={"lambd": 0.05, "alpha": 0.75, "t0": 2.0}, reference=_ref_asgd),
    OptimInfo(
        name="thor", cls=ms_optim.nn.thor, mindspore_cls=nn.thor,
        signature=[("net", EMPTY), ("learning_rate", EMPTY), ("damping", EMPTY), ("momentum", EMPTY),
                   ("weight_decay", 0.0), ("loss_scale", 1.0), ("batch_size", 32), ("use_nesterov", False),
                   ("decay_filter", lambda x: True), ("split_indices", None), ("enable_clip_grad", False),
                   ("frequency", 100)],
        make=_make_thor,
        good=[{}, {"learning_rate": Tensor(np.array([0.1, 0.05], np.float32))}, {"damping": Tensor(0.01)},
              {"weight_decay": 1, "loss_scale": 128, "batch_size": 8.0}, {"use_nesterov": True},
              {"decay_filter": lambda p: "bias" not in p.name}, {"split_indices": [0]},
              {"enable_clip_grad": True}, {"frequency": 2}, {"inverse": "full"}, {"block_size": 4}, {"kl_clip": 0.01},
              {"factor_convention": "kfc"}, {"trace_thresholds": (0.5, 0.2)}],
        bad=thor_bad(), state_prefixes=("moments.",),
        # frequency 2: THOR steps (new factors and inverses) at steps 0, 2, 4, ...; the steps between use them
        hyper={"damping": 0.03, "momentum": 0.9, "frequency": 2, "batch_size": 8},
        takes_params=False,
        extensions=("inverse", "block_size", "kl_clip", "factor_convention", "distribute_inverses",
                    "trace_thresholds", "adapt_every", "damping_bounds")),
]
PARAM_OPTIMIZERS = [info for info in OPTIMIZERS if info.takes_params]  # the first-order ones

BY_NAME = {info.name: info for info in OPTIMIZERS}


def mindspore_signature(cls) -> List[Tuple[str, Any]]:
    """MindSpore's documented signature: a function's own (``nn.thor``), or for a class the one its
    decorators hide: the ``<Class>.__init__`` function they wrap, minus ``self``."""
    if inspect.isfunction(cls):
        return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()]
    todo, seen = [cls.__init__], set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.__qualname__ == f"{cls.__name__}.__init__":
            return [(p.name, p.default) for p in list(inspect.signature(fn).parameters.values())[1:]]
        todo += [c.cell_contents for c in (fn.__closure__ or ()) if inspect.isfunction(c.cell_contents)]
    raise LookupError(f"no wrapped __init__ found for {cls.__name__}")
