"""THOR at depth: the batched inversion of a THOR step (``_thor.grouped``) gives THOR's numbers.

On CPU each factor is inverted by one fused op (``MsOptimBlockInverse``, checked on its own in
``test_thor_inverse_kernel.py``); elsewhere, and with ``MS_OPTIM_FUSED=0``, the factors' blocks are inverted
by one batched ``MatrixInverse`` per block width, in chunks. Both are checked here:

* A deep MLP with repeated 150-wide hidden layers (A and G of 150 split into 128-wide blocks, so
  blocks of several layers and both factors share one batched inversion) against the float64 NumPy
  oracle, every parameter after every step, in PYNATIVE and GRAPH mode, blocked and whole inverses,
  fused and composite.
* A conv net with three identical 3x3 convolutions (A of 144: two blocks, the last padded) trained
  with a loss scale: the composite batched inversion equal to the per-layer inversion
  (``slot.invert_layer``, which the other oracle tests check), the first THOR step's inverses bit for bit;
  the fused inversion equal to it within float32 rounding (it inverts in double precision).
* The same net with the 128-wide inversion cut into chunks of whole factors (``grouped.CHUNK_BYTES``
  made small): every loss, parameter and inverse bit for bit those of one inversion per width.
* The same net updated one parameter after the other (``update.sequential_step``, the default) and
  staged (every preconditioned gradient first): bit for bit the same.
* Its four 3x3 convolutions call one shared tap Cell (``taps.TapPool``): bit for bit the numbers
  of a private tap per layer; a layer's own setting (``set_factor_block_size``) gives it a tap of its own.
"""
import contextlib
from types import SimpleNamespace
from typing import Dict

import numpy as np
import pytest
from mindspore import Tensor, nn
from reference import thor_factors as tf
from reference.thor_ref import ThorReference, softmax_xent
from support.params import param_values
from support.thor_runs import train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.inversion import batched as grouped
from ms_optim._thor.modes import Strategy
from ms_optim._thor.net import taps
from ms_optim._thor.net.factor_kernels import factor_kernels
from ms_optim._thor.step import optimizer as thor_optimizer

pytestmark = pytest.mark.core  # selected by CI's version leg on the oldest MindSpore (.ci/run)

RTOL = 1e-3
# float32 against float64 through four layers and 150-wide whole-matrix inverses: entries near zero carry
# absolute errors of a few 1e-6 after five steps (weights are of order 0.1 to 1)
ATOL = 1e-5
WIDTHS = (20, 150, 150, 150, 10)


class DeepMLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(WIDTHS[i], WIDTHS[i + 1], activation="relu" if i < 3 else None)
                                   for i in range(4)])

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class DeepMLPRef:
    """Dense layers ``layers.0`` .. ``layers.3`` (ReLU between), biases; CE loss."""

    layers = tuple((f"layers.{i}", "dense") for i in range(4))

    def forward_backward(self, p: Dict[str, np.ndarray], x, y):
        inputs, pre = [], []
        h = x
        for i in range(4):
            inputs.append(h)
            s = h @ p[f"layers.{i}.weight"].T + p[f"layers.{i}.bias"]
            pre.append(s)
            h = np.maximum(s, 0.0) if i < 3 else s
        loss, d = softmax_xent(h, y)
        grads, factors = {}, {}
        for i in reversed(range(4)):
            if i < 3:
                d = d * (pre[i] > 0)
            grads[f"layers.{i}.weight"] = d.T @ inputs[i]
            grads[f"layers.{i}.bias"] = d.sum(0)
            factors[f"layers.{i}"] = tf.dense_factors(inputs[i], d)
            d = d @ p[f"layers.{i}.weight"]
        return loss, grads, factors


@pytest.fixture
def composite(monkeypatch):
    """The composite batched inversion (GPU, Ascend, ``MS_OPTIM_FUSED=0``): width groups, chunks."""
    monkeypatch.setenv("MS_OPTIM_FUSED", "0")


@pytest.mark.parametrize("inverse", ["blocked", "full"])
def test_deep_mlp_matches_reference(mode, rng, inverse, path):
    steps, batch = 5, 16
    net = DeepMLP()
    for p in net.trainable_params():
        fan_in = p.shape[1] if len(p.shape) > 1 else 1
        p.set_data(Tensor((rng.standard_normal(p.shape) * (np.sqrt(2.0 / fan_in) if len(p.shape) > 1 else 0.1))
                          .astype(np.float32)))
    lr = np.linspace(0.1, 0.05, steps).astype(np.float32)
    damping = np.linspace(0.05, 0.02, steps).astype(np.float32)
    ref = ThorReference(DeepMLPRef(), param_values(net), lr, damping, 0.9, batch_size=batch, frequency=2,
                        block_size=128 if inverse == "blocked" else None, weight_decay=1e-3)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, weight_decay=1e-3, batch_size=batch, frequency=2,
               inverse=inverse)
    assert opt.strategy == Strategy.BATCHED and bool(opt.inversion.fused) == (path == "fused")
    widths = opt.inversion.widths
    assert widths == ((10, 20, 128) if inverse == "blocked" else (10, 20, 150))
    cell = train_cell(net, opt)
    for step in range(steps):
        x = rng.standard_normal((batch, WIDTHS[0])).astype(np.float32)
        y = rng.integers(0, WIDTHS[-1], batch).astype(np.int32)
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL)
        got = param_values(net)
        for name, want in ref.params.items():
            np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=f"{name} after step {step}")


class RepeatedConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, pad_mode="pad", padding=1, has_bias=True)
        self.convs = nn.CellList([nn.Conv2d(16, 16, 3, pad_mode="pad", padding=1, has_bias=True) for _ in range(3)])
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(16 * 6 * 6, 5)

    def construct(self, x):
        x = self.relu(self.stem(x))
        for conv in self.convs:
            x = self.relu(conv(x))
        return self.fc(self.flatten(x))


def _train_repeated(per_layer: bool, seed_values, batches, groups: int = 4, staged: bool = False,
                    private_taps: bool = False, with_factors: bool = False, monkeypatch=None):
    net = RepeatedConvNet()
    for p, value in zip(net.trainable_params(), seed_values):
        p.set_data(Tensor(value))
    with monkeypatch.context() if per_layer else contextlib.nullcontext() as patch:
        if per_layer:  # the strategy of MindSpore's device rules and the trace rule, on a net the batched one
            # serves, inverting with MatrixInverse layer by layer (the fused op stays in the taps and products)
            patch.setattr(thor_optimizer, "choose_strategy", lambda config, rules: Strategy.PER_LAYER)
            kernels = factor_kernels()
            if kernels is not None:
                patch.setattr(thor_optimizer, "factor_kernels", lambda: kernels._replace(block_inverse_out=None))
        opt = thor(net, Tensor(np.full((4,), 0.01, np.float32)), Tensor(np.full((4,), 0.1, np.float32)), 0.9,
                   weight_decay=1e-4, loss_scale=64.0, batch_size=4, frequency=2)
    if not per_layer:
        assert opt.strategy == Strategy.BATCHED and opt.inversion.widths == (5, 16, 27, 128)  # fc G, conv G, A's
        assert len(opt.inversion.groups) == (0 if opt.inversion.fused else groups)
    else:
        assert opt.strategy == Strategy.PER_LAYER
    assert opt.step_rule.sequential  # no kl_clip, no clip, no Nesterov: one parameter after the other
    opt.step_rule.sequential = not staged  # read when the step is compiled (ms_optim._thor.step.update)
    shared = [layer.factor_tap for layer in opt.thor_cells]
    assert len({id(tap) for tap in shared}) == 2  # the stem and the three convolutions: one geometry, one tap
    if private_taps:
        for layer in opt.thor_cells:
            layer.factor_tap = layer.factor_tap.clone()
        taps = [layer.factor_tap for layer in opt.thor_cells]
        assert len({id(tap) for tap in taps + shared}) == 7  # five new taps
    cell = train_cell(net, opt, sens=64.0)
    losses = [float(cell(Tensor(x), Tensor(y)).asnumpy()) for x, y in batches]
    inverses = [p.asnumpy() for p in list(opt.matrix_a_inv) + list(opt.matrix_g_inv)]
    # with_factors: the stored factors too (a tap that ignored its flag would rewrite them on a non-THOR step)
    return losses, param_values(net, with_factors=with_factors), inverses


def _assert_same_run(run, want_run):
    """Two runs of ``_train_repeated``: every loss, parameter (and stored factor, when kept) and inverse bit
    for bit."""
    (losses, params, inverses), (want_losses, want_params, want_inverses) = run, want_run
    assert losses == want_losses
    assert set(params) == set(want_params)
    for name, want in want_params.items():
        np.testing.assert_array_equal(params[name], want, err_msg=name)
    for got, want in zip(inverses, want_inverses, strict=True):
        np.testing.assert_array_equal(got, want)


def _repeated_case(rng):
    template = RepeatedConvNet()
    values = [(rng.standard_normal(p.shape) * (np.sqrt(2.0 / np.prod(p.shape[1:])) if len(p.shape) > 1 else 0.1))
              .astype(np.float32) for p in template.trainable_params()]
    batches = [(rng.standard_normal((4, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, 4).astype(np.int32))
               for _ in range(4)]
    return values, batches


def test_repeated_conv_blocks_equal_per_layer_path(mode, rng, composite, monkeypatch):
    values, batches = _repeated_case(rng)
    first = _train_repeated(False, values, batches[:1])[2]
    for got, want in zip(first, _train_repeated(True, values, batches[:1], monkeypatch=monkeypatch)[2]):
        np.testing.assert_array_equal(got, want)  # the first THOR step: the same factors, inverted bit for bit
    losses, params, inverses = _train_repeated(False, values, batches)
    want_losses, want_params, want_inverses = _train_repeated(True, values, batches, monkeypatch=monkeypatch)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert set(params) == set(want_params)
    for name, want in want_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
    for got, want in zip(inverses, want_inverses):  # entries up to 1 / sqrt(damping) = 3.2: atol 3e-6 of that
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert inverses[1].shape == (2, 128, 128)  # a repeated conv's A (144): two blocks, the last padded
    assert not np.allclose(inverses[1][0], np.eye(128))  # the inverses were refreshed (not the initial identity)


def test_fused_inversion_matches_per_layer_path(mode, rng, monkeypatch):
    values, batches = _repeated_case(rng)
    losses, params, inverses = _train_repeated(False, values, batches)
    # MatrixInverse per layer
    want_losses, want_params, want_inverses = _train_repeated(True, values, batches, monkeypatch=monkeypatch)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for name, want in want_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
    for got, want in zip(inverses, want_inverses):  # entries up to 1 / sqrt(damping) = 3.2
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(inverses[1][0], np.eye(128))  # refreshed


def test_chunked_inversion_is_bit_for_bit_one_inversion(mode, rng, monkeypatch, composite):
    values, batches = _repeated_case(rng)
    losses, params, inverses = _train_repeated(False, values, batches)
    # the 128-wide blocks (three conv A of 2 blocks, the fc's A of 576: 5 blocks) in chunks of at most 2 blocks of
    # whole factors: one chunk per factor, the fc's A alone; 4 + 3 inversions
    monkeypatch.setattr(grouped, "CHUNK_BYTES", 2 * 4 * 128 ** 2)
    _assert_same_run(_train_repeated(False, values, batches, groups=7), (losses, params, inverses))
    assert not np.allclose(inverses[1][0], np.eye(128))  # refreshed


def test_sequential_update_is_bit_for_bit_staged(mode, rng, path):
    values, batches = _repeated_case(rng)
    run = _train_repeated(False, values, batches, with_factors=True)
    _assert_same_run(run, _train_repeated(False, values, batches, staged=True, with_factors=True))
    assert not np.allclose(run[1]["convs.0.weight"], values[2])  # trained


def test_shared_taps_are_bit_for_bit_private_taps(mode, rng, path):
    values, batches = _repeated_case(rng)
    run = _train_repeated(False, values, batches, with_factors=True)
    _assert_same_run(run, _train_repeated(False, values, batches, private_taps=True, with_factors=True))
    assert not np.allclose(run[2][1][0], np.eye(128))  # refreshed


def _always_branch(x, dout):  # pylint: disable=unused-argument
    return False


@pytest.mark.parametrize("mode", ["graph"], indirect=True)
@pytest.mark.parametrize("path", ["fused"], indirect=True)
def test_branch_free_taps_are_bit_for_bit_branched(mode, path, rng, monkeypatch):
    """GRAPH mode, fused ops, float32: the taps without their ``if flag`` branch (decided when the graph is
    compiled) give every loss, parameter, stored factor and inverse of the taps with it, over THOR and
    other steps."""
    assert taps._branch_free(Tensor(np.zeros(2, np.float32)), Tensor(np.zeros(2, np.float32)))
    assert not taps._branch_free(Tensor(np.zeros(2, np.float16)), Tensor(np.zeros(2, np.float32)))
    assert not taps._branch_free(Tensor(np.zeros(2, np.float32)), Tensor(np.zeros(2, np.float16)))
    values, batches = _repeated_case(rng)
    run = _train_repeated(False, values, batches, with_factors=True)
    assert "convs.0.matrix_a_cov" in run[1]
    monkeypatch.setattr(taps, "_branch_free", _always_branch)
    _assert_same_run(run, _train_repeated(False, values, batches, with_factors=True))
    assert not np.allclose(run[2][1][0], np.eye(128))  # refreshed


def test_tap_factor_pass_is_chosen_when_parsed(mode, path):
    """The taps' bprop holds one way of computing the factors, chosen in Python when the graph is parsed (a
    constant ``if`` in the bprop would still be expanded at every call site): the fused pass in GRAPH mode with
    the fused ops; the flagged pass (schedule guard, fused or composite ops under ``if flag``) otherwise."""
    net = RepeatedConvNet()
    steps = np.ones(3, np.float32)  # per-step lists: PYNATIVE taps get the schedule guard
    opt = thor(net, Tensor(0.01 * steps), Tensor(0.1 * steps), 0.9, batch_size=4)
    fused_graph = mode == "graph" and path == "fused"
    for layer in opt.thor_cells:
        tap = layer.factor_tap
        assert (tap.schedule_guard is None) == (mode == "graph")
        assert (tap.kernels is not None) == (path == "fused")
        chosen = tap.factor_pass.__func__
        assert chosen is (taps.FactorTap._fused_pass if fused_graph else taps.FactorTap._flagged_pass)


def test_a_layer_setting_copies_its_shared_tap():
    net = RepeatedConvNet()
    lr, damping = Tensor(np.array(0.01, np.float32)), Tensor(np.array(0.1, np.float32))
    opt = thor(net, lr, damping, 0.9, batch_size=4, frequency=2)
    stem, first, second = opt.thor_cells[:3]
    shared = first.factor_tap
    assert shared.shared and stem.factor_tap is shared and second.factor_tap is shared
    first.set_factor_block_size(64)
    assert first.factor_tap is not shared and not first.factor_tap.shared
    assert first.factor_tap.block_size == 64 and shared.block_size == 128 and second.factor_tap is shared
    assert first.factor_tap.sharing_key()[2:] == shared.sharing_key()[2:]  # convention, guard, geometry kept
    assert first.matrix_a_cov.shape == (3, 64, 64) and second.matrix_a_cov.shape == (2, 128, 128)


def test_chunk_members_cuts_whole_factors_in_order(monkeypatch):
    members = [(name, None, SimpleNamespace(nblocks=n), False) for name, n in zip("abcdef", (1, 3, 2, 5, 1, 1))]
    monkeypatch.setattr(grouped, "CHUNK_BYTES", 4 * 4 * 8 ** 2)  # 4 blocks of width 8
    names = [[m[0] for m in chunk] for chunk in grouped.chunk_members(8, members)]
    assert names == [["a", "b"], ["c"], ["d"], ["e", "f"]]  # d (5 blocks > 4) alone
