"""The argument sets ms_optim's optimizers must refuse, one list per optimizer, for the generic table
(support/optim_table.py): every "Raises" line of MindSpore's documentation for Lamb, LARS, ASGD and thor,
non-finite values, and ms_optim's clearer errors where MindSpore fails badly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

import numpy as np
from mindspore import Tensor, nn

import ms_optim

NAN = float("nan")
INF = float("inf")


@dataclass
class Bad:
    """Arguments that must be refused: ``build(target)`` raises ``error`` whose message contains
    ``'<name>'``, ``shows`` (the received value as the message writes it) and each of ``also`` (the
    constraint's words). ``target`` is what ``OptimInfo.target()`` makes."""
    label: str
    build: Callable[[Any], Any]
    error: type
    name: str
    shows: str
    also: Tuple[str, ...] = ()


def lamb_bad() -> List[Bad]:
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


def lars_bad() -> List[Bad]:
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


def asgd_bad() -> List[Bad]:
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


# ---- thor (on a net: a refused call leaves it unconverted, tests/thor/test_thor_validation.py) ----

THOR_LR = Tensor(np.full(4, 0.1, np.float32))
THOR_DAMPING = Tensor(np.full(4, 0.01, np.float32))


def thor_bad() -> List[Bad]:
    def row(error, shows, also=(), **override):
        (name, value), = override.items()
        build = lambda net: ms_optim.nn.thor(  # noqa: E731
            **{"net": net, "learning_rate": THOR_LR, "damping": THOR_DAMPING, "momentum": 0.9, **override})
        return Bad(f"{name}={value!r}"[:40], build, error, name, shows, tuple(also))
    return [
        # MindSpore's Raises lines: learning_rate not a Tensor; loss_scale, momentum or frequency not a float
        # (ms_optim, like MindSpore's code, takes an int loss_scale and wants an int frequency); weight_decay
        # neither float nor int; use_nesterov not a bool; frequency not an int; loss_scale <= 0;
        # weight_decay or momentum < 0; frequency < 2
        row(TypeError, "0.1", ["Tensor"], learning_rate=0.1),
        row(TypeError, "[0.1, 0.2]", learning_rate=[0.1, 0.2]),
        row(ValueError, "(2, 2)", learning_rate=Tensor(np.ones((2, 2), np.float32))),
        row(ValueError, "-1.0", learning_rate=Tensor(np.array([0.1, -1.0], np.float32))),
        row(TypeError, "0.01", ["Tensor"], damping=0.01),
        row(ValueError, "nan", damping=Tensor(np.array([np.nan], np.float32))),
        row(TypeError, "1", ["float"], momentum=1),
        row(TypeError, "'0.9'", momentum="0.9"),
        row(ValueError, "-0.1", [">= 0"], momentum=-0.1),
        row(ValueError, "-0.0001", weight_decay=-1e-4),
        row(TypeError, "'0'", weight_decay="0"),
        row(TypeError, "True", weight_decay=True),
        row(ValueError, "0.0", ["> 0"], loss_scale=0.0),
        row(ValueError, "-128", loss_scale=-128),
        row(TypeError, "'128'", loss_scale="128"),
        row(TypeError, "None", loss_scale=None),
        row(ValueError, "0", batch_size=0),
        row(ValueError, "32.5", ["whole"], batch_size=32.5),
        row(TypeError, "'32'", batch_size="32"),
        row(TypeError, "1", ["bool"], use_nesterov=1),
        row(TypeError, "'weights'", ["callable"], decay_filter="weights"),
        row(TypeError, "5", split_indices=5),
        row(TypeError, "0.5", split_indices=[0.5]),
        row(TypeError, "'yes'", enable_clip_grad="yes"),
        row(TypeError, "10.0", ["int"], frequency=10.0),
        row(ValueError, "1", [">= 2"], frequency=1),
        row(TypeError, "True", frequency=True),
        row(ValueError, "'cholesky'", inverse="cholesky"),
        row(TypeError, "None", ["str"], inverse=None),
        row(TypeError, "1", ["str", "int"], inverse=1),
        row(ValueError, "0", block_size=0),
        # non-finite numbers (NaN slips through `x < 0` style checks) and values beyond float32/int32
        row(ValueError, "nan", momentum=NAN),
        row(ValueError, "inf", momentum=INF),
        row(ValueError, "1e+300", ["float32"], momentum=1e300),
        row(ValueError, "nan", weight_decay=NAN),
        row(ValueError, "inf", weight_decay=INF),
        row(ValueError, "nan", loss_scale=NAN),
        row(ValueError, "inf", loss_scale=INF),
        row(ValueError, "1e+39", ["float32"], loss_scale=1e39),
        row(ValueError, "inf", learning_rate=Tensor(np.array([0.1, np.inf], np.float32))),
        row(ValueError, "-0.5", damping=Tensor(np.array([0.1, -0.5], np.float32))),
        row(ValueError, "4294967298", ["int32"], frequency=2**32 + 2),
        row(ValueError, "2147483653", ["int32"], frequency=2**31 + 5),
        row(ValueError, "2147483648", ["int32"], frequency=np.int64(2**31)),
        row(ValueError, "2147483648", ["int32"], batch_size=2**31),
        row(ValueError, "1099511627776", ["int32"], block_size=2**40),
        row(ValueError, "nan", kl_clip=NAN),
        row(TypeError, "'1e-3'", kl_clip="1e-3"),
        row(TypeError, "1", ["bool"], distribute_inverses=1),
        row(TypeError, "'yes'", distribute_inverses="yes"),
    ]
