"""Per-layer agreement of ms_optim's THOR with the float64 oracle of each factor convention.

For "gpu", "ascend" and "kfc", three nets (``ConvNet("pad")``: a conv + a Dense layer, so Ascend's
max-abs scale is on; ``EmbedNet``: Embedding + Dense + LayerNorm + Dense, batch_size 10 for a real
batch of 8; ``MLP(6, 5, 2)``: Ascend's ``Ginv = I`` for the 2-output Dense), loss scale 64, weight
decay 1e-3, frequency 2, lr 0.05, damping 0.03: the weight update of every THOR layer after 1 and
after 3 steps, ms_optim vs ``tests/reference/thor_conventions.py``, as relative error
``||u - u_ref|| / ||u_ref||`` and cosine. Prints one table row per convention, net, layer and step count.

    python tests/scripts/thor_agreement.py [--mode graph|pynative]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: reference (the oracles) and support
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor  # noqa: E402
from reference import thor_conventions as oracle  # noqa: E402
from reference.thor_ref import ConvRef, EmbedRef, MLPRef, ThorReference  # noqa: E402
from support.nets import MLP, ConvNet, EmbedNet  # noqa: E402
from support.params import param_values  # noqa: E402
from support.thor_runs import init_params, net_batches, train_cell  # noqa: E402

from ms_optim._thor.factory import thor  # noqa: E402

NETS = {"conv+dense": (lambda: ConvNet("pad"), lambda: ConvRef((3, 2), 2, 1, 1, "pad"), "conv", (), 8),
        "embedding+dense": (EmbedNet, lambda: EmbedRef(1e-7), "ids", ("ln",), 10),
        "dense, 2 outputs": (lambda: MLP(6, 5, 2), MLPRef, "vectors", (), 8)}
SCALE, WD, LR, DAMPING = 64.0, 1e-3, 0.05, 0.03


def weight_name(layer: str, kind: str) -> str:
    return f"{layer}.embedding_table" if kind == "embedding" else f"{layer}.weight"


def agreement(convention: str, net_name: str, steps: int):
    make, make_ref, data, layernorm, bs = NETS[net_name]
    net = make()
    init_params(net, np.random.default_rng(4))
    start = param_values(net)
    model = make_ref()
    has_conv = any(kind == "conv" for _, kind in model.layers)
    ref = ThorReference(model, start, np.full(steps, LR), np.full(steps, DAMPING), 0.9, weight_decay=WD, batch_size=bs,
                        frequency=2, layernorm=layernorm,
                        inverses=oracle.reference_inverses(convention, bs, has_conv))
    opt = thor(net, Tensor(np.full(steps, LR, np.float32)), Tensor(np.full(steps, DAMPING, np.float32)), 0.9,
               weight_decay=WD, loss_scale=SCALE, batch_size=bs, frequency=2, factor_convention=convention)
    cell = train_cell(net, opt, sens=SCALE)
    for x, y in net_batches(np.random.default_rng(5), data, steps):
        cell(Tensor(x), Tensor(y))
        ref.step(x, y)
    got = param_values(net)
    rows = []
    for layer, kind in model.layers:
        name = weight_name(layer, kind)
        u, u_ref = (got[name] - start[name]).ravel(), (ref.params[name] - start[name]).ravel()
        rel = np.linalg.norm(u - u_ref) / np.linalg.norm(u_ref)
        cos = float(u @ u_ref / (np.linalg.norm(u) * np.linalg.norm(u_ref)))
        rows.append((layer, kind, rel, cos))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    print(f"mode {args.mode}; loss scale {SCALE}, weight decay {WD}, lr {LR}, damping {DAMPING}, frequency 2")
    print(f"{'convention':<10} {'net':<16} {'layer':<6} {'kind':<10} {'steps':>5} {'rel. error':>11} {'cosine':>10}")
    for convention in ("gpu", "ascend", "kfc"):
        for net_name in NETS:
            for steps in (1, 3):
                for layer, kind, rel, cos in agreement(convention, net_name, steps):
                    print(f"{convention:<10} {net_name:<16} {layer:<6} {kind:<10} {steps:>5} {rel:>11.2e} {cos:>10.7f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
