"""Worker for the data-parallel tests (run by ``msrun`` on 2 CPU ranks, or alone as the reference).

Trains a small conv + dense network for a few steps on a fixed global batch. Under ``msrun`` each
rank takes its half of the batch (data parallel, ``gradients_mean=True``, mccl backend); alone
(``--single``) the process trains on the whole, concatenated batch. Writes the final parameters of
every configuration to ``OUT/<tag>_rank<r>.npz`` (``OUT/<tag>_single.npz`` alone), plus a direct
check of ``FactorAllReduce`` under ``msrun``.

Configurations: ``CONFIGS`` (every rank inverts every layer) and ``SHARED_CONFIGS`` (THOR only,
``distribute_inverses=True``: each layer inverted by one rank, counted in ``inversion_count``), and
``DEVICE_CONFIGS`` (THOR only, ``factor_convention`` "gpu"/"ascend": MindSpore's inverse averaging; each
in GRAPH_MODE and PYNATIVE_MODE, tags ``<config>_<mode>``, with the initial parameters saved as
``__init__/<name>`` for the float64 oracle of ``test_data_parallel.py``).

Usage: python worker.py --out DIR --optimizer {thor,momentum} [--single] [--steps N]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # support: the tests' shared nets and helpers

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402
from support.msrun import state_file  # noqa: E402

from ms_optim._bridge import prime_numpy_bridge  # noqa: E402

GLOBAL_BATCH = 8
# split_indices per configuration; "split_past": ResNet-50's hard-coded [26, 53] past this net's 3 layers
CONFIGS = {"split0": [0], "default": None, "trace": None, "embed": None, "split_past": [0, 26, 53]}
# the same with the inversions shared across ranks (distribute_inverses=True)
SHARED_CONFIGS = {"shared_split0": [0], "shared_default": None, "shared_trace": None, "shared_embed": None}
# trace_thresholds per configuration (decided from the all-reduced factors)
TRACE = {"trace": (0.5, 0.2), "shared_trace": (0.5, 0.2)}


class SmallNet(nn.Cell):
    """conv(2->3, 3x3, pad 1, bias) -> ReLU -> flatten -> Dense(3*4*4 -> 5) -> ReLU -> Dense(5 -> 3)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="pad", padding=1, has_bias=True, weight_init="normal")
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(3 * 4 * 4, 5, weight_init="normal")
        self.fc2 = nn.Dense(5, 3, weight_init="normal")

    def construct(self, x):
        x = self.flatten(self.relu(self.conv(x)))
        return self.fc2(self.relu(self.fc1(x)))


class EmbedNet(nn.Cell):
    """Embedding(7 -> 4) of token ids read off the input (|x[:, 0, 0, :]| * 3, floored, mod 7) -> flatten ->
    Dense(16 -> 3): THOR's EmbeddingThor (diagonal A) beside a dense layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 4, 3, weight_init="normal")

    def construct(self, x):
        ids = ops.cast(ops.floor(ops.abs(x[:, 0, 0, :]) * 3.0), ms.int32) % 7
        return self.fc(self.flatten(self.embed(ids)))


NETS = {"embed": EmbedNet, "shared_embed": EmbedNet}  # the net per configuration (default SmallNet)


class ConvFcNet(nn.Cell):
    """conv(2->3, 3x3, pad 1, bias) -> ReLU -> flatten -> Dense(48 -> 3): ``reference.thor_ref.ConvRef``."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(3 * 4 * 4, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def _ids_net():
    from support.nets import EmbedNet as IdsNet  # Embedding(12, 6) x 3 ids -> Dense -> LayerNorm -> Dense(4)

    return IdsNet()


# factor_convention "gpu"/"ascend" (inverses averaged over the ranks): (net, convention, trace_thresholds, data)
DEVICE_CONFIGS = {"gpu_conv": (ConvFcNet, "gpu", None, "images"),
                  "ascend_conv": (ConvFcNet, "ascend", None, "images"),
                  "gpu_embed": (_ids_net, "gpu", None, "ids"),
                  "ascend_trace": (ConvFcNet, "ascend", (2.0, 0.1), "images")}  # deltas ~1.3 then ~0.8: due, then skip
DEVICE_LR, DEVICE_DAMPING, DEVICE_WD, DEVICE_SCALE = 0.05, 0.03, 1e-3, 32.0


def global_batches(steps: int):
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(steps, GLOBAL_BATCH, 2, 4, 4)).astype(np.float32)
    ys = rng.integers(0, 3, size=(steps, GLOBAL_BATCH)).astype(np.int32)
    return xs, ys


def build(optimizer: str, split_indices, batch_size: int, distribute_inverses: bool = False,
          trace_thresholds=None, net_class=SmallNet):
    ms.set_seed(0)
    net = net_class()
    if optimizer == "thor":
        from ms_optim.nn import thor

        lr = Tensor(np.full((64,), 0.05, np.float32))
        damping = Tensor(np.full((64,), 0.03, np.float32))
        opt = thor(net, lr, damping, 0.9, weight_decay=1e-4, batch_size=batch_size,
                   split_indices=split_indices, frequency=2, distribute_inverses=distribute_inverses,
                   trace_thresholds=trace_thresholds)
    else:
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)


def init_ranks(single: bool):
    """(rank, number of ranks): (0, 1) alone; under msrun, init() and data parallel with mean gradients."""
    prime_numpy_bridge()  # before init(): see ms_optim._bridge
    if single:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init

    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


#: the execution modes a two-mode worker runs each configuration in, with their tag suffixes
BOTH_MODES = (("graph", ms.GRAPH_MODE), ("pynative", ms.PYNATIVE_MODE))


def start_worker(description: str, extra=None):
    """A worker's start: its arguments (``--out OUT [--single]``, and what ``extra(parser)`` adds), the CPU
    context and the ranks (:func:`init_ranks`). Returns ``(args, rank, size)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    parser.add_argument("--single", action="store_true", help="one process on the concatenated batch")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    ms.set_context(device_target="CPU")
    rank, size = init_ranks(args.single)
    return args, rank, size


def save_state(args, rank: int, tag: str, state) -> None:
    """``state`` (name -> array) of run ``tag`` to this process's file (``support.msrun.state_file``)."""
    np.savez(state_file(args.out, tag, None if args.single else rank), **state)


def trained_state(net, optimizer):
    """The net's Parameters and the optimizer's (moments, inverses, global_step, ...) by name, as arrays."""
    state = {p.name: p.asnumpy() for p in net.get_parameters()}
    state.update({p.name: p.asnumpy() for p in optimizer.get_parameters()})
    return state


def _worker_arguments(parser) -> None:
    parser.add_argument("--optimizer", choices=["thor", "momentum"], default="thor")
    parser.add_argument("--steps", type=int, default=5)


def main() -> None:
    args, rank, size = start_worker(__doc__.splitlines()[0], _worker_arguments)
    ms.set_context(mode=ms.GRAPH_MODE)
    local = GLOBAL_BATCH // size
    xs, ys = global_batches(args.steps)
    configs = dict(CONFIGS, **(SHARED_CONFIGS if args.optimizer == "thor" else {}))
    for tag, split in configs.items():
        net, train = build(args.optimizer, split, local, distribute_inverses=tag in SHARED_CONFIGS,
                           trace_thresholds=TRACE.get(tag), net_class=NETS.get(tag, SmallNet))
        losses = []
        for s in range(args.steps):
            x = xs[s, rank * local:(rank + 1) * local]
            y = ys[s, rank * local:(rank + 1) * local]
            losses.append(float(train(Tensor(x), Tensor(y)).asnumpy()))
        # the net's Parameters (weights, the layers' rank-local factors, flags) and the optimizer's
        # state (moments, inverses built from the all-reduced factors, global_step)
        params = trained_state(net, train.optimizer)
        params["__losses__"] = np.array(losses)
        sharing = getattr(train.optimizer, "sharing", None)
        if tag in SHARED_CONFIGS:  # who inverts what, as this rank computed it
            params["__owners__"] = np.array(sharing.owners)
            params["__costs__"] = np.array(sharing.costs)
            params["__sharing_fusion__"] = np.array([op.attrs["fusion"] for op in getattr(sharing, "allreduces", [])])
        save_state(args, rank, tag, params)
    if not args.single:
        from ms_optim._thor.parallel import FactorAllReduce

        factors = tuple(Tensor(np.full((2, 2), (rank + 1) * (i + 1), np.float32)) for i in range(3))
        for tag, split in CONFIGS.items():
            cell = FactorAllReduce(3, split)
            reduced = cell(factors)
            fusion = np.array([op.attrs["fusion"] for op in cell.allreduces])
            np.savez(os.path.join(args.out, f"allreduce_{tag}_rank{rank}.npz"),
                     *[r.asnumpy() for r in reduced], fusion=fusion)
    if args.optimizer == "thor" and not args.single:
        run_device_configs(args, rank, local)
    print(f"worker rank {rank}/{size} done")


def device_batches(data: str, steps: int):
    """The global batches of a ``DEVICE_CONFIGS`` entry: images (B, 2, 4, 4) with 3 classes, or ids (B, 3) < 12
    with 4 classes."""
    if data == "images":
        return global_batches(steps)
    rng = np.random.default_rng(8)
    return (rng.integers(0, 12, size=(steps, GLOBAL_BATCH, 3)).astype(np.int32),
            rng.integers(0, 4, size=(steps, GLOBAL_BATCH)).astype(np.int32))


def run_device_configs(args, rank: int, local: int) -> None:
    """Each of ``DEVICE_CONFIGS`` in both modes, with loss scale and weight decay, from well-scaled initial
    values (``support.thor_runs.init_params``, the same on every rank)."""
    from support.thor_runs import init_params

    from ms_optim.nn import thor

    for mode_name, mode in BOTH_MODES:
        ms.set_context(mode=mode)
        for tag, (make, convention, trace, data) in DEVICE_CONFIGS.items():
            net = make()
            init_params(net, np.random.default_rng(11))
            init = {f"__init__/{p.name}": p.asnumpy().copy() for p in net.trainable_params()}  # not a view
            opt = thor(net, Tensor(np.full((64,), DEVICE_LR, np.float32)),
                       Tensor(np.full((64,), DEVICE_DAMPING, np.float32)), 0.9, weight_decay=DEVICE_WD,
                       loss_scale=DEVICE_SCALE, batch_size=local, frequency=2, factor_convention=convention,
                       trace_thresholds=trace)
            loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt, sens=DEVICE_SCALE)
            xs, ys = device_batches(data, args.steps)
            losses = [float(train(Tensor(xs[s, rank * local:(rank + 1) * local]),
                                  Tensor(ys[s, rank * local:(rank + 1) * local])).asnumpy()) for s in range(args.steps)]
            params = {p.name: p.asnumpy() for p in net.trainable_params()}
            params.update({p.name: p.asnumpy() for p in opt.get_parameters() if "inv" in p.name})
            params.update(init, __losses__=np.array(losses))
            save_state(args, rank, f"{tag}_{mode_name}", params)
    ms.set_context(mode=ms.GRAPH_MODE)


if __name__ == "__main__":
    main()
