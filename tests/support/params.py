"""Parameters for the tests: made from a spec, and read back as NumPy arrays."""
from typing import Dict, List, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor


def make_params(rng, spec: Sequence[tuple], dtype=np.float32) -> Tuple[List[Parameter], List[np.ndarray]]:
    """spec: ``(name, shape)`` or ``(name, shape, zero_init)`` rows -> (Parameters, their initial arrays).

    Standard normal values drawn from ``rng`` in spec order (zeros where ``zero_init``); each Parameter
    holds a copy, so the arrays stay the initial values for a reference to start from."""
    arrays, names = [], []
    for row in spec:
        name, shape = row[0], row[1]
        zero = len(row) > 2 and row[2]
        arrays.append(np.zeros(shape, dtype) if zero else rng.standard_normal(shape).astype(dtype))
        names.append(name)
    return [Parameter(Tensor(a.copy()), name=n) for n, a in zip(names, arrays)], arrays


def param_values(net, dtype=np.float64, with_factors: bool = False) -> Dict[str, np.ndarray]:
    """``{name: value}`` of the trainable Parameters of ``net``, as copies in ``dtype`` (float64 for the
    oracles; float32 to compare runs of MindSpore with each other). ``with_factors``: THOR layers' stored
    ``*_cov`` factors too."""
    return {p.name: p.asnumpy().astype(dtype) for p in net.get_parameters()
            if p.requires_grad or (with_factors and p.name.endswith("_cov"))}
