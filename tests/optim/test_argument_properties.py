"""One property, every constructor argument of Lamb, LARS, ASGD, thor and DenseThor/Conv2dThor/EmbeddingThor.

For an argument and a value drawn by hypothesis (wrong types, bools, numpy scalars, NaN, +-inf,
negatives, huge numbers beyond int32/float32, ordinary ints and floats, Tensors), the rest of the
arguments good (tests/support/optim_table.py's tables for the three first-order optimizers): either

* the object is built AND one training step runs with a finite loss and finite parameters, or
* it raises TypeError or ValueError whose message names the argument (``'<name>'``);

never any other exception type. Examples are derandomized (CI reproducible) and few per argument.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import mindspore.common.dtype as mstype
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mindspore import Parameter, Tensor, nn, ops
from support.optim_table import BY_NAME

from ms_optim._thor.factory import thor
from ms_optim._thor.net.layers import Conv2dThor, DenseThor, EmbeddingThor

NAN, INF = float("nan"), float("inf")

POOL = [None, "0.1", "x", [0.1], (), (1, 2), {}, object(), True, False, np.float32(0.5), np.float64(0.5),
        np.float16(2.0), np.int64(3), np.int32(-2), np.bool_(True), NAN, -NAN, INF, -INF, -1, -0.5, 0, 0.0, 1, 2,
        3, 0.9, 1e-3, 2**31, 2**40, 2**64, 1e39, 1e300, -1e300, Tensor(np.float32(0.1)), Tensor(np.float32(NAN)),
        Tensor(np.array([0.1, -1.0], np.float32)), Tensor(np.array([0.1] * 8, np.float32))]
VALUES = st.one_of(st.sampled_from(POOL), st.integers(min_value=-3, max_value=12),
                   st.floats(min_value=-1e6, max_value=1e6), st.sampled_from([NAN, INF, -INF]))


def _finite(*arrays) -> bool:
    return all(np.all(np.isfinite(a)) for a in arrays)


# ----------------------------------------------------------------------------------- first-order optimizers
def _dense_params() -> List[Parameter]:
    rng = np.random.default_rng(0)
    return [Parameter(Tensor(rng.standard_normal((3, 16)).astype(np.float32) * 0.1), name="dense.weight"),
            Parameter(Tensor(np.zeros(3, np.float32)), name="dense.bias")]


def _step_optimizer(opt, params) -> bool:
    rng = np.random.default_rng(1)
    grads = tuple(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.01) for p in params)
    opt(grads)
    return _finite(*(p.asnumpy() for p in params))


def _first_order(name: str, arg: str) -> Callable[[Any], bool]:
    def build_and_step(value) -> bool:
        params = _dense_params()
        if name == "LARS":
            kwargs = {"optimizer": nn.Momentum(params, 0.05, 0.9), arg: value}
            opt = BY_NAME[name].cls(**kwargs)
        else:
            kwargs = {"params": params, "learning_rate": 0.05, arg: value}
            if arg == "params":
                kwargs["params"] = value
            opt = BY_NAME[name].cls(**kwargs)
        return _step_optimizer(opt, params)
    return build_and_step


# ----------------------------------------------------------------------------------- thor and the layers
class _MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 5, activation="relu")
        self.fc2 = nn.Dense(5, 3)

    def construct(self, x):
        return self.fc2(self.fc1(x))


def _train_step(net, opt, x, y=None) -> bool:
    """One TrainOneStepCell step (cross-entropy with labels ``y``, else the mean of the output)."""
    if y is None:
        class _MeanLoss(nn.Cell):
            def __init__(self, body):
                super().__init__()
                self.body = body

            def construct(self, inputs):
                return ops.reduce_mean(ops.cast(self.body(inputs), mstype.float32))
        cell = nn.TrainOneStepCell(_MeanLoss(net), opt).set_train()
        loss = cell(x)
    else:
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt).set_train()
        loss = cell(x, y)
    return math.isfinite(float(loss.asnumpy())) and _finite(*(p.asnumpy() for p in net.trainable_params()))


THOR_GOOD = dict(learning_rate=Tensor(np.full(8, 0.05, np.float32)), damping=Tensor(np.full(8, 0.03, np.float32)),
                 momentum=0.9)


def _thor(arg: str) -> Callable[[Any], bool]:
    def build_and_step(value) -> bool:
        net = _MLP()
        kwargs = {**THOR_GOOD, arg: value}
        if arg == "net":
            return thor(value, **THOR_GOOD) is None  # only refusals are possible for a non-net value
        opt = thor(net, **kwargs)
        rng = np.random.default_rng(2)
        return _train_step(net, opt, Tensor(rng.standard_normal((4, 6)).astype(np.float32)),
                           Tensor(rng.integers(0, 3, 4).astype(np.int32)))
    return build_and_step


class _Holder(nn.Cell):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def construct(self, x):
        return self.layer(x)


LAYER_GOOD: Dict[type, Dict[str, Any]] = {
    DenseThor: dict(in_channels=6, out_channels=3),
    Conv2dThor: dict(in_channels=2, out_channels=3, kernel_size=3),
    EmbeddingThor: dict(vocab_size=10, embedding_size=4),
}


def _layer_input(layer):
    rng = np.random.default_rng(3)
    if isinstance(layer, DenseThor):
        return Tensor(rng.standard_normal((4, layer.in_channels)).astype(np.float32))
    if isinstance(layer, Conv2dThor):
        kh, kw = layer.kernel_size
        dh, dw = layer.dilation
        size = max(8, dh * (kh - 1) + 1, dw * (kw - 1) + 1)
        return Tensor(rng.standard_normal((2, layer.in_channels, size, size)).astype(np.float32))
    return Tensor(rng.integers(0, layer.vocab_size, (4, 3)).astype(np.int32))


def _layer(cls: type, arg: str) -> Callable[[Any], bool]:
    def build_and_step(value) -> bool:
        layer = cls(**{**LAYER_GOOD[cls], arg: value})
        net = _Holder(layer)
        opt = thor(net, Tensor(np.float32(0.05)), Tensor(np.float32(0.03)), 0.9)
        return _train_step(net, opt, _layer_input(layer))
    return build_and_step


# ----------------------------------------------------------------------------------- the argument table
def _table() -> List[Tuple[str, str, Callable[[Any], bool]]]:
    rows = []
    for name in ("Lamb", "LARS", "ASGD"):
        for arg, _ in BY_NAME[name].signature:
            rows.append((name, arg, _first_order(name, arg)))
    for arg in ("net", "learning_rate", "damping", "momentum", "weight_decay", "loss_scale", "batch_size",
                "use_nesterov", "decay_filter", "split_indices", "enable_clip_grad", "frequency", "inverse",
                "block_size", "kl_clip"):
        rows.append(("thor", arg, _thor(arg)))
    layer_args = {DenseThor: ("in_channels", "out_channels", "weight_init", "bias_init", "has_bias", "activation"),
                  Conv2dThor: ("in_channels", "out_channels", "kernel_size", "stride", "pad_mode", "padding",
                               "dilation", "group", "has_bias", "weight_init", "bias_init"),
                  EmbeddingThor: ("vocab_size", "embedding_size", "use_one_hot", "embedding_table", "dtype",
                                  "padding_idx")}
    for cls, args in layer_args.items():
        rows.extend((cls.__name__, arg, _layer(cls, arg)) for arg in args)
    return rows


TABLE = [pytest.param(o, a, f, id=f"{o}.{a}") for o, a, f in _table()]


@pytest.mark.parametrize("owner,arg,build_and_step", TABLE)
def test_argument_is_accepted_and_trains_or_refused_naming_it(owner, arg, build_and_step):
    @settings(max_examples=10, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(value=VALUES)
    def check(value):
        try:
            finite = build_and_step(value)
        except (TypeError, ValueError) as exc:
            assert f"'{arg}'" in str(exc), f"{owner}({arg}={value!r}) raised {type(exc).__name__} not naming it: {exc}"
            return
        except Exception as exc:  # noqa: BLE001 - the property: no other exception type, whatever it is
            pytest.fail(f"{owner}({arg}={value!r}) raised {type(exc).__name__}: {exc}")
        assert finite, f"{owner}({arg}={value!r}) was accepted but its training step gave non-finite values"

    check()
