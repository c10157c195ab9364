"""``thor(..., distribute_inverses=True)`` without msrun: the owner assignment (greedy longest-processing-
time over the cost ``sum w^3`` of the A and G blocks) and, on one device, the exact equality with
``distribute_inverses=False`` (PYNATIVE and GRAPH mode) plus the float64 reference. The 2-rank runs are
in tests/distributed/test_data_parallel.py."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import Tensor
from reference.thor_ref import EmbedRef, MLPRef, ThorReference
from support.nets import MLP, EmbedNet
from support.params import param_values
from support.thor_runs import init_params, mlp_batches, run_against_oracle, schedules, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.inversion.owners import assign_inversions, layout_cost
from ms_optim._thor.inversion.preconditioner import BlockLayout


def _loads(costs, owners, ranks):
    loads = [0] * ranks
    for cost, owner in zip(costs, owners):
        loads[owner] += cost
    return loads


def test_assign_inversions_known_case():
    # LPT: 8 -> r0, 7 -> r1, 6 -> r1 (7 < 8), 5 -> r0 (8 < 13), 4 -> r0 (13 == 13: lower rank)
    assert assign_inversions([5, 8, 6, 4, 7], 2) == (0, 0, 1, 0, 1)
    assert assign_inversions([3, 3, 3], 1) == (0, 0, 0)
    assert assign_inversions([2, 2], 4) == (0, 1)  # more ranks than layers: some own nothing
    with pytest.raises(ValueError, match="0"):
        assign_inversions([1], 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=8), st.integers(1, 4))
def test_assign_inversions_covers_once_deterministic_and_balanced(costs, ranks):
    owners = assign_inversions(costs, ranks)
    assert len(owners) == len(costs) and all(0 <= o < ranks for o in owners)  # every layer, exactly one owner
    assert assign_inversions(list(costs), ranks) == owners  # deterministic
    loads = _loads(costs, owners, ranks)
    # the optimum by brute force; Graham's bound for LPT: max load <= (4/3 - 1/(3R)) * optimum
    best = min(max(_loads(costs, choice, ranks)) for choice in itertools.product(range(ranks), repeat=len(costs)))
    assert max(loads) <= (4 / 3 - 1 / (3 * ranks)) * best + 1e-9
    # the greedy invariant: the most loaded rank was the least loaded when it got its last (smallest) layer
    heavy = loads.index(max(loads))
    mine = [c for c, o in zip(costs, owners) if o == heavy]
    if mine:
        assert max(loads) - min(mine) <= min(loads)


def test_costs_are_sum_of_cubed_block_widths():
    assert layout_cost(BlockLayout(150, 128)) == 128 ** 3 + 22 ** 3
    assert layout_cost(BlockLayout(150, None)) == 150 ** 3
    assert layout_cost(None, 12) == 12  # an embedding's diagonal A
    net = MLP()  # fc1: A 20, G 150 (128 + 22); fc2: A 150, G 10
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, distribute_inverses=True)
    assert opt.sharing.costs == (20 ** 3 + 128 ** 3 + 22 ** 3, 128 ** 3 + 22 ** 3 + 10 ** 3)
    assert opt.sharing.num_ranks == 1 and not opt.sharing.is_distributed and opt.sharing.owned == (True, True)
    assert opt.sharing.rank_loads() == (sum(opt.sharing.costs),)


def test_resnet18_assignment_is_balanced():
    from model_zoo.resnet.src.resnet import resnet18

    net = resnet18(class_num=10, width=16)
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, inverse="full", distribute_inverses=True)
    costs = opt.sharing.costs
    assert len(costs) == opt.num_layers == 21
    owners = assign_inversions(costs, 2)
    loads = _loads(costs, owners, 2)
    # three equal 1152-wide A factors (layer4) dominate: the best split is 2:1 of those, about 56:44 overall
    assert sum(loads) == sum(costs) and max(loads) <= 0.57 * sum(costs), loads


def _all_state(net, opt):
    state = {p.name: p.asnumpy() for p in net.get_parameters()}
    state.update({p.name: p.asnumpy() for p in opt.get_parameters() if p.name != "inversion_count"})
    return state


@pytest.mark.parametrize("kind", ["mlp", "embedding"])
def test_one_device_true_equals_false_exactly(mode, rng, kind):
    """One device: distribute_inverses=True inverts every layer locally (counted) and changes no number;
    both runs also match the float64 reference."""
    steps, frequency = 5, 2
    lr, damping = schedules(steps)
    if kind == "mlp":
        batches = mlp_batches(rng, steps)
    else:
        batches = [(rng.integers(0, 12, (8, 3)).astype(np.int32), rng.integers(0, 4, 8).astype(np.int32))
                   for _ in range(steps)]
    states = []
    for distribute in (False, True):
        net = MLP() if kind == "mlp" else EmbedNet()
        init_params(net, np.random.default_rng(3))
        if kind == "mlp":
            ref = ThorReference(MLPRef(), param_values(net), lr, damping, 0.9, batch_size=16,
                                frequency=frequency, weight_decay=0.01)
            opt = thor(net, Tensor(lr), Tensor(damping), 0.9, weight_decay=0.01, batch_size=16, frequency=frequency,
                       distribute_inverses=distribute)
        else:
            ref = ThorReference(EmbedRef(1e-7), param_values(net), lr, damping, 0.9, batch_size=8,
                                frequency=frequency, layernorm=("ln",))
            opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=frequency,
                       distribute_inverses=distribute)
        run_against_oracle(net, ref, train_cell(net, opt), batches)
        if distribute:
            thor_steps = len(range(0, steps, frequency))
            np.testing.assert_array_equal(opt.sharing.inversion_count.asnumpy(), [thor_steps] * opt.num_layers)
        else:
            assert "inversion_count" not in {p.name for p in opt.get_parameters()}
        states.append(_all_state(net, opt))
    assert set(states[0]) == set(states[1])
    for name in states[0]:
        np.testing.assert_array_equal(states[1][name], states[0][name], err_msg=name)
