"""One table of ms_optim's first-order optimizers for the generic tests (torch's OptimizerInfo style).

Per optimizer: how to build it on a list of Parameters (or groups), its expected public signature
(MindSpore 2.10's documented one; MindSpore's own classes hide it behind a decorator), argument sets
that must be accepted, argument sets that must be refused (exception type, the argument the message
must name, and the received value it must show), the prefixes of its state Parameters, and a float64
reference of its update for the numeric generic tests.

Every "Raises" line of MindSpore's documentation for Lamb, LARS and ASGD is a row of ``bad`` (plus
ms_optim's clearer errors where MindSpore fails badly: ``LARS("sgd")``, ``lars_filter=3``, negative
``lambd``/``alpha``). A learning-rate list shorter than the steps trained is tested per optimizer in
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

EMPTY = inspect.Parameter.empty
NAN = float("nan")
INF = float("inf")


def _lars_filter_default(param: Parameter) -> bool:
    """MindSpore's documented default ``lars_filter``: no LARS for LayerNorm parameters and biases."""
    return "LayerNorm" not in param.name and "bias" not in param.name


@dataclass
class Bad:
    """Arguments that must be refused: ``build(params)`` raises ``error`` whose message contains
    ``'<name>'`` and ``shows`` (the received value as the message writes it)."""
    label: str
    build: Callable[[List[Parameter]], Any]
    error: type
    name: str
    shows: str


@dataclass
class OptimInfo:
    """What the generic tests need to know about one optimizer."""
    name: str
    cls: type                                        # the public class (ms_optim.nn.<name>)
    mindspore_cls: type                              # mindspore.nn.<name>, for its hidden signature
    signature: List[Tuple[str, Any]]                 # (argument, default) in order; EMPTY = required
    make: Callable[..., nn.Optimizer]                # make(params_or_groups, learning_rate, weight_decay, **hyper)
    good: List[Dict[str, Any]]                       # keyword sets make() must accept
    bad: List[Bad]                                   # argument sets the class must refuse
    state_prefixes: Tuple[str, ...]                  # names of state Parameters start with these
    hyper: Dict[str, Any] = field(default_factory=dict)  # hyper-parameters for the numeric runs
    reference: Optional[Callable[..., Any]] = None   # reference(arrays, names, centralize_flags, **hyper)
    centralization: bool = True                      # numeric runs may use grad_centralization groups

    def __repr__(self) -> str:  # readable pytest ids
        return self.name


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


def _lamb_bad() -> List[Bad]:
    def lamb(**kw):
        return lambda ps: ms_optim.nn.Lamb(**{"params": ps, "learning_rate": 0.1, **kw})
    return [
        Bad("int beta1", lamb(beta1=1), TypeError, "beta1", "1"),
        Bad("beta1 = 1.5", lamb(beta1=1.5), ValueError, "beta1", "1.5"),
        Bad("beta1 = 0.0", lamb(beta1=0.0), ValueError, "beta1", "0.0"),
        Bad("beta1 = 1.0", lamb(beta1=1.0), ValueError, "beta1", "1.0"),
        Bad("int beta2", lamb(beta2=0), TypeError, "beta2", "0"),
        Bad("beta2 = 1.0", lamb(beta2=1.0), ValueError, "beta2", "1.0"),
        Bad("beta2 = -0.5", lamb(beta2=-0.5), ValueError, "beta2", "-0.5"),
        Bad("int eps", lamb(eps=1), TypeError, "eps", "1"),
        Bad("eps = 0.0", lamb(eps=0.0), ValueError, "eps", "0.0"),
        Bad("eps < 0", lamb(eps=-1e-6), ValueError, "eps", "-1e-06"),
        Bad("negative weight_decay", lamb(weight_decay=-0.1), ValueError, "weight_decay", "-0.1"),
        Bad("str weight_decay", lamb(weight_decay="0.1"), TypeError, "weight_decay", "'0.1'"),
        Bad("non-Parameter params", lambda ps: ms_optim.nn.Lamb([1.0, 2.0], 0.1), TypeError, "params", "1.0"),
        Bad("Tensor params", lambda ps: ms_optim.nn.Lamb(Tensor(np.ones(2, np.float32)), 0.1),
            TypeError, "params", "Tensor"),
        Bad("group of non-Parameters", lambda ps: ms_optim.nn.Lamb([{"params": [3]}], 0.1),
            TypeError, "params", "3"),
        Bad("str learning_rate", lamb(learning_rate="0.1"), TypeError, "learning_rate", "'0.1'"),
        Bad("negative learning_rate", lamb(learning_rate=-0.1), ValueError, "learning_rate", "-0.1"),
        Bad("2-D Tensor learning_rate", lamb(learning_rate=Tensor(np.ones((2, 2), np.float32))),
            ValueError, "learning_rate", "(2, 2)"),
        # non-finite values (NaN passes `x < low` tests): every one named with its value
        Bad("beta1 = nan", lamb(beta1=NAN), ValueError, "beta1", "nan"),
        Bad("beta1 = inf", lamb(beta1=INF), ValueError, "beta1", "inf"),
        Bad("beta2 = nan", lamb(beta2=NAN), ValueError, "beta2", "nan"),
        Bad("beta2 = -inf", lamb(beta2=-INF), ValueError, "beta2", "-inf"),
        Bad("eps = nan", lamb(eps=NAN), ValueError, "eps", "nan"),
        Bad("eps = inf", lamb(eps=INF), ValueError, "eps", "inf"),
        Bad("learning_rate = nan", lamb(learning_rate=NAN), ValueError, "learning_rate", "nan"),
        Bad("learning_rate = inf", lamb(learning_rate=INF), ValueError, "learning_rate", "inf"),
        Bad("weight_decay = nan", lamb(weight_decay=NAN), ValueError, "weight_decay", "nan"),
        Bad("weight_decay = inf", lamb(weight_decay=INF), ValueError, "weight_decay", "inf"),
        Bad("list learning_rate with nan", lamb(learning_rate=[0.1, NAN]), ValueError, "learning_rate", "nan"),
        Bad("list learning_rate with a negative", lamb(learning_rate=[0.1, -0.2]), ValueError, "learning_rate",
            "-0.2"),
        Bad("empty list learning_rate", lamb(learning_rate=[]), ValueError, "learning_rate", "[]"),
        Bad("list learning_rate with a str", lamb(learning_rate=[0.1, "x"]), TypeError, "learning_rate", "'x'"),
        Bad("Tensor learning_rate with nan", lamb(learning_rate=Tensor(np.array([0.1, np.nan], np.float32))),
            ValueError, "learning_rate", "nan"),
        Bad("Tensor learning_rate negative", lamb(learning_rate=Tensor(np.float32(-0.5))), ValueError,
            "learning_rate", "-0.5"),
        Bad("group lr with nan", lambda ps: ms_optim.nn.Lamb([{"params": ps, "lr": [0.1, NAN]}], 0.1),
            ValueError, "lr", "nan"),
    ]


# ---- LARS (around MindSpore's Momentum) -------------------------------------------------------------

def _make_lars(params, learning_rate=0.05, weight_decay=0.0, momentum=0.9, **hyper):
    inner = nn.Momentum(params, learning_rate, momentum, weight_decay=weight_decay)
    return ms_optim.nn.LARS(inner, **hyper)


def _ref_lars(arrays, names, centralize_flags, momentum=0.9, epsilon=1e-5, coefficient=0.001, use_clip=False):
    keep = [_lars_filter_default(Parameter(Tensor(np.zeros(1, np.float32)), name=n)) for n in names]
    return LarsReference(MomentumReference(arrays, momentum), keep, coefficient, epsilon, use_clip)


def _lars_bad() -> List[Bad]:
    def lars(**kw):
        return lambda ps: ms_optim.nn.LARS(nn.Momentum(ps, 0.1, 0.9), **kw)
    return [
        Bad("optimizer is a str", lambda ps: ms_optim.nn.LARS("sgd"), TypeError, "optimizer", "'sgd'"),
        Bad("optimizer is None", lambda ps: ms_optim.nn.LARS(None), TypeError, "optimizer", "None"),
        Bad("optimizer is a list of Parameters", lambda ps: ms_optim.nn.LARS(ps), TypeError, "optimizer", "list"),
        Bad("int epsilon", lars(epsilon=1), TypeError, "epsilon", "1"),
        Bad("int coefficient", lars(coefficient=1), TypeError, "coefficient", "1"),
        Bad("use_clip = 1", lars(use_clip=1), TypeError, "use_clip", "1"),
        Bad("use_clip = 'True'", lars(use_clip="True"), TypeError, "use_clip", "'True'"),
        Bad("lars_filter = 3", lars(lars_filter=3), TypeError, "lars_filter", "3"),
        Bad("epsilon = nan", lars(epsilon=NAN), ValueError, "epsilon", "nan"),
        Bad("epsilon = inf", lars(epsilon=INF), ValueError, "epsilon", "inf"),
        Bad("epsilon < 0", lars(epsilon=-1e-5), ValueError, "epsilon", "-1e-05"),
        Bad("coefficient = nan", lars(coefficient=NAN), ValueError, "coefficient", "nan"),
        Bad("coefficient = inf", lars(coefficient=INF), ValueError, "coefficient", "inf"),
        Bad("coefficient < 0", lars(coefficient=-0.001), ValueError, "coefficient", "-0.001"),
        # MindSpore's Momentum accepts these lists; LARS refuses them before the first step
        Bad("inner learning_rate = []", lambda ps: ms_optim.nn.LARS(nn.Momentum(ps, [], 0.9)), ValueError,
            "learning_rate", "[]"),
        Bad("inner learning_rate list with nan", lambda ps: ms_optim.nn.LARS(nn.Momentum(ps, [0.1, NAN], 0.9)),
            ValueError, "learning_rate", "nan"),
        Bad("inner learning_rate Tensor with a negative",
            lambda ps: ms_optim.nn.LARS(nn.Momentum(ps, Tensor(np.array([0.1, -0.2], np.float32)), 0.9)),
            ValueError, "learning_rate", "-0.2"),
    ]


# ---- ASGD -------------------------------------------------------------------------------------------

def _make_asgd(params, learning_rate=0.05, weight_decay=0.0, **hyper):
    return ms_optim.nn.ASGD(params, learning_rate, weight_decay=weight_decay, **hyper)


def _ref_asgd(arrays, names, centralize_flags, lambd=1e-4, alpha=0.75, t0=1e6):
    return ASGDReference(arrays, lambd, alpha, t0, centralize_flags)


def _asgd_bad() -> List[Bad]:
    def asgd(**kw):
        return lambda ps: ms_optim.nn.ASGD(**{"params": ps, **kw})
    return [
        Bad("int lambd", asgd(lambd=1), TypeError, "lambd", "1"),
        Bad("int alpha", asgd(alpha=1), TypeError, "alpha", "1"),
        Bad("int t0", asgd(t0=1000000), TypeError, "t0", "1000000"),
        Bad("negative lambd", asgd(lambd=-1e-4), ValueError, "lambd", "-0.0001"),
        Bad("negative alpha", asgd(alpha=-0.75), ValueError, "alpha", "-0.75"),
        Bad("negative weight_decay", asgd(weight_decay=-0.01), ValueError, "weight_decay", "-0.01"),
        Bad("list weight_decay", asgd(weight_decay=[0.1]), TypeError, "weight_decay", "[0.1]"),
        Bad("non-Parameter params", lambda ps: ms_optim.nn.ASGD(["w", "b"]), TypeError, "params", "'w'"),
        Bad("params mixing Parameters and dicts", lambda ps: ms_optim.nn.ASGD([ps[0], {"params": ps[1:]}]),
            TypeError, "params", "Parameter"),
        Bad("learning_rate is an object", asgd(learning_rate=object()), TypeError, "learning_rate", "object"),
        Bad("negative learning_rate", asgd(learning_rate=-1), ValueError, "learning_rate", "-1"),
        Bad("lambd = nan", asgd(lambd=NAN), ValueError, "lambd", "nan"),
        Bad("lambd = inf", asgd(lambd=INF), ValueError, "lambd", "inf"),
        Bad("alpha = nan", asgd(alpha=NAN), ValueError, "alpha", "nan"),
        Bad("alpha = inf", asgd(alpha=INF), ValueError, "alpha", "inf"),
        Bad("t0 = nan", asgd(t0=NAN), ValueError, "t0", "nan"),
        Bad("t0 = -inf", asgd(t0=-INF), ValueError, "t0", "-inf"),
        Bad("learning_rate = nan", asgd(learning_rate=NAN), ValueError, "learning_rate", "nan"),
        Bad("weight_decay = nan", asgd(weight_decay=NAN), ValueError, "weight_decay", "nan"),
        Bad("list learning_rate with inf", asgd(learning_rate=[0.1, INF]), ValueError, "learning_rate", "inf"),
        Bad("Tensor learning_rate with a negative", asgd(learning_rate=Tensor(np.array([0.1, -1.0], np.float32))),
            ValueError, "learning_rate", "-1.0"),
    ]


OPTIMIZERS: List[OptimInfo] = [
    OptimInfo(
        name="Lamb", cls=ms_optim.nn.Lamb, mindspore_cls=nn.Lamb,
        signature=[("params", EMPTY), ("learning_rate", EMPTY), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-6),
                   ("weight_decay", 0.0)],
        make=_make_lamb,
        good=[{}, {"beta1": 0.5, "beta2": 0.9, "eps": 1e-8}, {"learning_rate": 1}, {"weight_decay": 0},
              {"learning_rate": Tensor(0.1)}, {"learning_rate": [0.1, 0.05]}, {"weight_decay": nn.Dense(1, 1)},
              {"learning_rate": (x / 10 for x in range(1, 4))}],  # a generator, read once
        bad=_lamb_bad(), state_prefixes=("lamb_m.", "lamb_v."),
        hyper={"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}, reference=_ref_lamb),
    OptimInfo(
        name="LARS", cls=ms_optim.nn.LARS, mindspore_cls=nn.LARS,
        signature=[("optimizer", EMPTY), ("epsilon", 1e-05), ("coefficient", 0.001), ("use_clip", False),
                   ("lars_filter", _lars_filter_default)],
        make=_make_lars,
        good=[{}, {"epsilon": 0.0, "coefficient": 0.01}, {"use_clip": True}, {"lars_filter": lambda p: True},
              {"learning_rate": [0.1, 0.05]}, {"momentum": 0.0}, {"coefficient": 0.0}],
        bad=_lars_bad(), state_prefixes=("moments.",),
        hyper={"momentum": 0.9, "coefficient": 0.02, "epsilon": 1e-5}, reference=_ref_lars,
        centralization=False),  # the wrapped nn.Momentum centralizes with a primitive CPU lacks
    OptimInfo(
        name="ASGD", cls=ms_optim.nn.ASGD, mindspore_cls=nn.ASGD,
        signature=[("params", EMPTY), ("learning_rate", 0.1), ("lambd", 1e-4), ("alpha", 0.75), ("t0", 1e6),
                   ("weight_decay", 0.0)],
        make=_make_asgd,
        good=[{}, {"lambd": 0.0, "alpha": 0.0, "t0": -1.0}, {"learning_rate": 0}, {"weight_decay": 1},
              {"learning_rate": Tensor([0.1, 0.2])}, {"t0": INF}],  # t0 = inf: never average
        bad=_asgd_bad(), state_prefixes=("ax_.", "mu_", "eta_"),
        hyper={"lambd": 0.05, "alpha": 0.75, "t0": 2.0}, reference=_ref_asgd),
]

BY_NAME = {info.name: info for info in OPTIMIZERS}


def mindspore_signature(cls: type) -> List[Tuple[str, Any]]:
    """The signature MindSpore's decorators hide: the ``<Class>.__init__`` function they wrap, minus ``self``."""
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
