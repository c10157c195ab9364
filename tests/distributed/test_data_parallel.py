"""Data-parallel THOR on 2 CPU ranks through ``msrun`` (mccl backend, 127.0.0.1).

Both ranks must end with identical parameters, equal (rtol 1e-4) to one process trained on the
concatenated batch, with ``split_indices=[0]`` (two fusion groups), the default (one group) and
``trace_thresholds`` (the trace rule's decisions and state agree on both ranks and with one process),
a net with an embedding (EmbeddingThor's diagonal A factor), and ResNet-50's ``[26, 53]`` appended to
``[0]`` on this 3-layer net (the indices past the last layer split nothing: bit for bit the ``[0]`` run).
This holds because the factors are mean-all-reduced: with the per-device normalisation
A = a^T a / B and G = B d^T d = (1/B) sum_i g_i g_i^T (d = g/B for the local mean loss), the mean of
the two ranks' factors is the factor of the 2B-sample batch, as the mean gradient is its gradient.

With ``distribute_inverses=True`` each layer is inverted by one rank only (each rank's
``inversion_count`` shows its share; the shares partition the layers) and the parameters are those of
the run where both ranks invert everything, and so again those of the concatenated batch.

With ``factor_convention`` "gpu" or "ascend" (``worker.DEVICE_CONFIGS``: a conv + Dense net under each, an
Embedding net under gpu, and the trace rule under ascend; loss scale 32, weight decay; GRAPH and
PYNATIVE mode) the ranks average their own inverses as MindSpore does: both ranks must end identical
and equal the float64 oracle of that rule (``reference.thor_ranks.ShardedModel`` with
``reference.thor_conventions``), step by step in loss and at the end in every parameter and inverse.
"""
import os
import sys

import numpy as np
import pytest
from support.msrun import load_ranks_and_single, results_fixture

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import worker  # noqa: E402  (its configurations: the oracle below replays them)

WORKER = os.path.join(HERE, "worker.py")
OPTIMIZER = "thor"
CONFIGS = ("split0", "default", "trace", "embed", "split_past")
SHARED = {"shared_split0": "split0", "shared_default": "default",  # shared config -> its unshared twin
          "shared_trace": "trace", "shared_embed": "embed"}
META = ("__losses__", "__owners__", "__costs__", "__sharing_fusion__")

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


results = results_fixture(WORKER, "dp", ("--optimizer", OPTIMIZER))


@pytest.mark.parametrize("tag", CONFIGS)
def test_ranks_identical_and_equal_to_concatenated_batch(results, tag):
    rank0, rank1, single = load_ranks_and_single(results, tag)
    names = [k for k in single.files if k != "__losses__"]
    assert set(names) == {k for k in rank0.files if k != "__losses__"}
    local_factors = [n for n in names if n.endswith(("matrix_a_cov", "matrix_g_cov"))]
    # SmallNet: conv, fc1, fc2; EmbedNet: embedding (diagonal A), fc: A and G each
    assert len(local_factors) == (4 if tag == "embed" else 6), local_factors
    assert any("inv" in n for n in names), names  # the optimizer's inverses are compared too
    for name in names:
        if name in local_factors:
            # each layer keeps the factor of its rank's half batch (the optimizer all-reduces a copy):
            # the mean of the two is the factor of the concatenated batch, and it was collected
            assert np.abs(single[name]).sum() > 0, name
            np.testing.assert_allclose((rank0[name] + rank1[name]) / 2, single[name], rtol=1e-4, atol=1e-6,
                                       err_msg=name)
            continue
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-4, atol=1e-6, err_msg=name)
    if tag == "trace":  # THOR's trace rule: every rank decided from the all-reduced factors, as the single process
        counts = [int(single[f"thor_inversions_{i}"]) for i in range(3)]
        assert min(counts) >= 1 and sum(counts) < 3 * 3, counts  # 3 THOR steps: some layer skipped one
    # each rank saw half the batch: the mean of the two local losses is the concatenated batch's loss
    np.testing.assert_allclose((rank0["__losses__"] + rank1["__losses__"]) / 2, single["__losses__"], rtol=1e-4)
    # and the training really moved (the parameters are not at their initial values on both sides)
    assert not np.allclose(rank0["__losses__"][0], rank0["__losses__"][-1])


def test_split_indices_past_the_last_layer_split_nothing(results):
    """[0, 26, 53] on a 3-layer net in data parallel: 26 and 53 are dropped (as MindSpore's fusion pass drops
    indices past the last gradient), so the run is bit for bit the [0] run on both ranks."""
    for rank in range(2):
        got = np.load(results / f"split_past_rank{rank}.npz")
        want = np.load(results / f"split0_rank{rank}.npz")
        assert set(got.files) == set(want.files)
        for name in want.files:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("tag, fusion", [("split0", [1, 2, 2]), ("default", [1, 1, 1])])
def test_factor_allreduce_mean_and_fusion_groups(results, tag, fusion):
    for rank in range(2):
        reduced = np.load(results / f"allreduce_{tag}_rank{rank}.npz")
        # rank r contributed (r+1)*(i+1) for layer i: the mean over 2 ranks is 1.5*(i+1)
        for i in range(3):
            np.testing.assert_allclose(reduced[f"arr_{i}"], np.full((2, 2), 1.5 * (i + 1)), rtol=0)
        np.testing.assert_array_equal(reduced["fusion"], fusion)


@pytest.mark.parametrize("shared", sorted(SHARED))
def test_shared_inverses_equal_unshared_and_concatenated_batch(results, shared):
    plain = SHARED[shared]
    for rank in range(2):
        got = np.load(results / f"{shared}_rank{rank}.npz")
        want = np.load(results / f"{plain}_rank{rank}.npz")
        names = [k for k in want.files if k not in META]
        assert set(names) == {k for k in got.files if k not in META and k != "inversion_count"}
        for name in names:  # the owner's inverse plus zeros (x + 0 == x): bit-for-bit the unshared numbers
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(got["__losses__"], want["__losses__"])
    single = np.load(results / f"{shared}_single.npz")
    rank0 = np.load(results / f"{shared}_rank0.npz")
    for name in single.files:
        if name in META or name.endswith(("matrix_a_cov", "matrix_g_cov")) or name == "inversion_count":
            continue
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("shared", sorted(SHARED))
def test_each_rank_inverts_only_its_share(results, shared):
    from ms_optim._thor.inversion.owners import assign_inversions

    ranks = [np.load(results / f"{shared}_rank{r}.npz") for r in range(2)]
    owners = ranks[0]["__owners__"]
    np.testing.assert_array_equal(ranks[1]["__owners__"], owners)  # both ranks computed the same assignment
    costs = [int(c) for c in ranks[0]["__costs__"]]
    if shared == "shared_embed":  # embedding: diagonal A of 7 (cost 7) + G 4x4; fc A 16x16 + G 3x3
        assert costs == [7 + 4 ** 3, 16 ** 3 + 3 ** 3]
        assert tuple(owners) == assign_inversions(costs, 2) == (1, 0)
    else:  # SmallNet: conv A 18x18 + G 3x3, fc1 A 48x48 + G 5x5, fc2 A 5x5 + G 3x3 (one block each)
        assert costs == [18 ** 3 + 3 ** 3, 48 ** 3 + 5 ** 3, 5 ** 3 + 3 ** 3]
        assert tuple(owners) == assign_inversions(costs, 2) == (1, 0, 1)  # LPT: fc1 alone, conv + fc2 together
    single = np.load(results / f"{shared}_single.npz")
    if shared == "shared_trace":  # the inversions the trace rule chose (the same on both ranks and in one process)
        per_layer = np.array([int(ranks[0][f"thor_inversions_{i}"]) for i in range(3)])
        np.testing.assert_array_equal([int(ranks[1][f"thor_inversions_{i}"]) for i in range(3)], per_layer)
        np.testing.assert_array_equal([int(single[f"thor_inversions_{i}"]) for i in range(3)], per_layer)
        assert per_layer.min() >= 1 and per_layer.sum() < 9, per_layer  # the rule skipped some, not all
    else:
        per_layer = np.array([3] * len(costs))  # every layer on steps 0, 2, 4 of 5 at frequency 2
    counts = np.stack([r["inversion_count"] for r in ranks])
    for rank in range(2):
        np.testing.assert_array_equal(counts[rank], np.where(owners == rank, per_layer, 0), err_msg=f"rank {rank}")
    np.testing.assert_array_equal(counts.sum(axis=0), per_layer)  # every layer inverted by exactly one rank
    # one device: every layer inverted locally
    np.testing.assert_array_equal(single["inversion_count"], per_layer)
    fusion = ranks[0]["__sharing_fusion__"]  # one fused AllReduce per split_indices group, ids apart from the factors'
    assert list(fusion) == ([1024, 1025, 1025] if shared == "shared_split0" else [1024] * len(costs))


def _device_oracle(tag, init):
    """The float64 replay of ``worker.DEVICE_CONFIGS[tag]`` on 2 ranks of 4 (MindSpore's inverse averaging)."""
    from reference.thor_conventions import reference_inverses
    from reference.thor_ranks import ShardedModel
    from reference.thor_ref import ConvRef, EmbedRef, ThorReference
    from reference.thor_trace_ref import ThorTraceReference

    _, convention, trace, data = worker.DEVICE_CONFIGS[tag]
    model = ConvRef((3, 3), 1, 1, 1, "pad") if data == "images" else EmbedRef(1e-7)
    has_conv = data == "images"
    local = worker.GLOBAL_BATCH // 2
    kwargs = dict(weight_decay=worker.DEVICE_WD, batch_size=local, frequency=2,
                  layernorm=() if has_conv else ("ln",), inverses=reference_inverses(convention, local, has_conv))
    lr = np.full(64, worker.DEVICE_LR)
    damping = np.full(64, worker.DEVICE_DAMPING)
    sharded = ShardedModel(model, 2, convention, local)
    if trace is None:
        return ThorReference(sharded, init, lr, damping, 0.9, **kwargs)
    return ThorTraceReference(sharded, init, lr, damping, 0.9, trace_thresholds=trace, **kwargs)


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("tag", sorted(worker.DEVICE_CONFIGS))
def test_device_conventions_average_inverses_as_mindspore(results, tag, mode):
    ranks = [np.load(results / f"{tag}_{mode}_rank{r}.npz") for r in range(2)]
    for name in (n for n in ranks[0].files if n != "__losses__"):  # parameters, inverses, counters: equal on both
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    init = {k[len("__init__/"):]: ranks[0][k].astype(np.float64) for k in ranks[0].files if k.startswith("__init__/")}
    ref = _device_oracle(tag, init)
    xs, ys = worker.device_batches(worker.DEVICE_CONFIGS[tag][3], 5)
    for s in range(5):
        ref.step(xs[s].astype(np.float64) if xs.dtype == np.float32 else xs[s], ys[s])
    losses = (ranks[0]["__losses__"] + ranks[1]["__losses__"]) / 2  # each rank's loss is its shard's
    np.testing.assert_allclose(losses, ref.losses, rtol=1e-3, err_msg="mean loss per step")
    for name, want in ref.params.items():
        np.testing.assert_allclose(ranks[0][name], want, rtol=1e-3, atol=1e-6, err_msg=f"{tag} {name}")
    for i, (name, _) in enumerate(ref.model.layers):  # the inverses of the last THOR step (step 4)
        for which, want in (("a", ref.a_inv[name]), ("g", ref.g_inv[name])):
            got = ranks[0][f"matrix_{which}_inv_blocks_{i}"].astype(np.float64)
            got = got if got.ndim == 1 else got[0]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                       err_msg=f"{tag} {which} inverse of {name}")
    if worker.DEVICE_CONFIGS[tag][2] is not None:  # the trace rule: the oracle's decisions from the mean traces
        counts = [int(ranks[0][f"thor_inversions_{i}"]) for i in range(len(ref.model.layers))]
        assert counts == [ref.inversions[name] for name, _ in ref.model.layers], (counts, ref.inversions)
        assert min(counts) >= 1 and sum(counts) < 3 * len(counts), counts  # some layer skipped a refresh


def test_averaging_inverses_is_not_averaging_factors():
    """The rule the device configurations check is a different number from the factor mean (else the test
    above could not tell them apart): conv layer, 2 ranks, gpu and ascend."""
    rng = np.random.default_rng(2)
    from reference.thor_conventions import effective_factors, inverses
    from reference.thor_ref import block_inverse

    args = dict(kernel_size=(3, 3), stride=1, dilation=1, pad_mode="pad", padding=1)
    raws = tuple(("conv", rng.standard_normal((4, 2, 4, 4)) * (1 + 3 * r), rng.standard_normal((4, 3, 4, 4)), args)
                 for r in range(2))
    for convention in ("gpu", "ascend"):
        a_avg, _ = inverses(convention, raws, 0.03, 4)
        mean_a = np.mean([effective_factors(convention, raw, 4)[0] for raw in raws], axis=0)
        a_of_mean = block_inverse(mean_a, np.sqrt(0.03), 128)
        assert np.abs(a_avg - a_of_mean).max() > 0.05 * np.abs(a_of_mean).max(), convention
