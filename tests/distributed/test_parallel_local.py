"""FactorAllReduce on one device (identity) and its fusion-group assignment (no msrun needed)."""
import numpy as np
from mindspore import Tensor

from ms_optim._thor.parallel import FactorAllReduce, data_parallel_group_size, fusion_groups


def test_fusion_groups_follow_mindspore_split_indices():
    assert fusion_groups(4) == [0, 0, 0, 0]
    assert fusion_groups(4, [0]) == [0, 1, 1, 1]
    assert fusion_groups(54, [26, 53]) == [0] * 27 + [1] * 27  # the model zoo's ResNet-50 setting
    assert fusion_groups(5, [1, 3]) == [0, 0, 1, 1, 2]


def test_identity_on_one_device():
    assert data_parallel_group_size() == 1
    cell = FactorAllReduce(2, [0])
    assert not cell.is_distributed
    factors = (Tensor(np.arange(4, dtype=np.float32).reshape(2, 2)), Tensor(np.ones(3, np.float32)))
    out = cell(factors)
    assert len(out) == 2
    for a, b in zip(out, factors):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
