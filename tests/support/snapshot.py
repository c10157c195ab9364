"""Snapshots of a net, a Model and an optimizer, to check that a refused call changed nothing.

``snapshot(net, model=None, optimizer=None)`` records: every cell of ``net`` (path, type, its
precision/amp flags and training mode), every Parameter (name, dtype, shape, requires_grad, value),
the Model's attributes (by identity) and the optimizer's Parameters (name, value).
``assert_unchanged(before, after)`` compares two snapshots and names the first difference.
"""
import numpy as np


def _cells(net):
    rows = []
    for name, cell in net.cells_and_names():
        flags = dict(getattr(cell, "_func_graph_flags", {}) or {})
        rows.append((name, type(cell), tuple(sorted(flags.items())), getattr(cell, "_mixed_precision_type", None),
                     bool(getattr(cell, "training", False))))
    return rows


def _described(params):
    return {p.name: (str(p.dtype), tuple(p.shape), bool(p.requires_grad), p.asnumpy().copy()) for p in params}


def snapshot(net, model=None, optimizer=None):
    return {"cells": _cells(net), "params": _described(net.get_parameters()),
            "model": None if model is None else {k: id(v) for k, v in vars(model).items()},
            "optimizer": None if optimizer is None else _described(optimizer.get_parameters())}


def _assert_params_equal(before, after, what):
    assert before.keys() == after.keys(), f"{what}: parameter names changed"
    for name, (dtype, shape, grad, value) in before.items():
        dtype2, shape2, grad2, value2 = after[name]
        assert (dtype, shape, grad) == (dtype2, shape2, grad2), f"{what}: {name} changed dtype/shape/requires_grad"
        np.testing.assert_array_equal(value, value2, err_msg=f"{what}: {name} changed value")


def assert_unchanged(before, after):
    assert len(before["cells"]) == len(after["cells"]), "the net's cells changed"
    for old, new in zip(before["cells"], after["cells"]):
        assert old == new, f"cell changed: {old} -> {new}"
    _assert_params_equal(before["params"], after["params"], "net")
    assert before["model"] == after["model"], "the Model's attributes changed"
    if before["optimizer"] is not None:
        _assert_params_equal(before["optimizer"], after["optimizer"], "optimizer")
