"""Convert a network's ``nn.Dense``/``nn.Conv2d``/``nn.Conv1d``/``nn.Embedding`` layers to THOR layers.

THE rule of which cells become THOR layers (:func:`thor_class_for`, :func:`thor_candidates`), and the one
converter that applies it in place, for ``thor()`` (:func:`convert_net`, with the layers' final settings)
and for ``ConvertNetUtils().convert_to_thor_net`` (the default settings). What is kept and what stays a
plain layer is stated once, in :class:`ConvertNetUtils`'s docstring.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from mindspore import nn

from ms_optim._thor.modes import Convention
from ms_optim._thor.net import (
    kinds,  # noqa: F401  (layers registers the THOR classes of the kinds)
    layers,  # noqa: F401  (layers registers the THOR classes of the kinds)
)
from ms_optim._thor.net.layer_base import DEFAULT_SETTINGS, ThorLayer
from ms_optim._thor.net.taps import TapPool, TapSettings
from ms_optim._validation import check_type

__all__ = ["ConvertNetUtils", "convert_net", "thor_class_for", "thor_candidates", "count_thor_cells",
           "is_thor_cell"]

_FACTOR_ATTRS = ("matrix_a_cov", "matrix_g_cov", "thor_flag")
_PRECISION_FLAGS = ("fp16", "fp32", "bf16")


def thor_class_for(cell: nn.Cell, convention: str = Convention.KFC) -> Optional[type]:
    """THE rule: the THOR class that converts the plain layer ``cell`` under the concrete factor
    ``convention``, or None if ``cell`` stays as it is.

    A cell converts iff a registered spec supports it (its exact plain type, and for convolutions
    ``group == 1`` and NCHW: ``spec.supports``), the spec converts under ``convention``
    (``spec.conventions``: ``nn.Conv1d`` under ``"kfc"`` only) and its weight has ``requires_grad=True``.
    Everything that decides which layers THOR preconditions goes through this function (with
    :func:`thor_candidates`): the converter, ``thor()``'s validation and ``split_indices`` check,
    and :func:`count_thor_cells`.
    """
    if isinstance(cell, ThorLayer):
        return None
    for spec in kinds.registered():
        if spec.supports(cell):
            convertible = convention in spec.conventions and spec.weight(cell).requires_grad
            return spec.thor_class if convertible else None
    return None


def is_thor_cell(cell: nn.Cell) -> bool:
    """Whether ``cell`` is a THOR layer the optimizer preconditions (its weight is trainable)."""
    return isinstance(cell, ThorLayer) and cell.weight_param().requires_grad


def thor_candidates(net: nn.Cell, convention: str = Convention.KFC) -> List[Tuple[str, nn.Cell]]:
    """``(name, cell)`` of every layer THOR preconditions in ``net`` under ``convention``, in
    ``cells_and_names()`` order: trainable THOR layers already there (under any convention) and the plain
    layers :func:`convert_net` would convert (by :func:`thor_class_for`). Touches nothing. After
    conversion these are exactly the THOR layers the optimizer gets.

    ``net`` itself is included only if it is already a THOR layer: a bare plain layer passed as the
    whole network cannot be replaced in place (wrap it in a Cell)."""
    return [(name, cell) for name, cell in net.cells_and_names()
            if is_thor_cell(cell) or (cell is not net and thor_class_for(cell, convention) is not None)]


def count_thor_cells(net: nn.Cell, convention: str = Convention.KFC) -> int:
    """Number of THOR layers ``net`` has, or will have once converted under ``convention`` (the converter
    is not run)."""
    return len(thor_candidates(net, convention))


def convert_net(net: nn.Cell, settings: TapSettings = DEFAULT_SETTINGS) -> List[ThorLayer]:
    """Convert ``net`` in place for THOR with ``settings``; return its THOR layers, :func:`thor_candidates`'s.

    Every plain layer :func:`thor_class_for` converts under ``settings.convention`` becomes its THOR layer,
    built with ``settings`` (factor Parameters in the blocks of ``settings.block_size``, a tap with the
    convention, ``batch_size`` and schedule guard); the THOR layers already in the net (an earlier
    conversion) get the same settings, their factors kept unless the block width changes. Layers whose
    taps compute alike share one tap (``taps.TapPool``). After it, nothing needs to touch the layers.

    Raises:
        TypeError: if ``net`` is not a Cell.
        ValueError: if ``settings.convention`` is not a concrete convention (gpu, ascend or kfc: ``thor()``
            resolves ``"auto"`` first).
    """
    check_type("net", net, nn.Cell, "convert_net", what="a Cell")
    if settings.convention not in Convention.CONCRETE:
        allowed = ", ".join(repr(c) for c in Convention.CONCRETE)
        raise ValueError(f"For 'convert_net', the argument 'settings.convention' must be one of {allowed}, "
                         f"but got {settings.convention!r}.")
    taps = TapPool()
    made = ConvertNetUtils()._convert(net, settings, taps)  # pylint: disable=protected-access
    found = [cell for _, cell in thor_candidates(net, settings.convention)]
    for layer in found:
        if id(layer) not in made:  # made before: this conversion's settings
            layer._settle(settings, taps)  # pylint: disable=protected-access
    return found


class ConvertNetUtils:
    """Converts a network's layers to THOR layers in place: MindSpore's ``ConvertNetUtils``, on any backend.

    Every cell reachable from the network (nested Cells, ``SequentialCell``, ``CellList``, ``CellDict``, cells
    held as attributes) that is a trainable ``nn.Dense``, ``nn.Conv2d`` with ``group=1`` in NCHW,
    ``nn.Embedding`` or ``nn.Conv1d`` is replaced by :class:`ms_optim.nn.DenseThor`,
    :class:`ms_optim.nn.Conv2dThor`, :class:`ms_optim.nn.EmbeddingThor` or :class:`ms_optim.nn.Conv1dThor`,
    built around the layer's own Parameter objects. Hence:

    * weights, biases, dtypes and Parameter names are unchanged (a checkpoint of the converted net loads
      into the plain net and back; the THOR layers only add ``matrix_a_cov``, ``matrix_g_cov`` and
      ``thor_flag``, named after the layer's weight: ``fc1.weight`` gives ``fc1.matrix_a_cov``);
    * stride, padding, pad_mode, dilation, non-square kernels and biases are kept, so the converted net
      computes exactly what the plain net computes, and mixed-precision flags carry over;
    * a layer object used at several places becomes one THOR layer used at the same places;
    * THOR layers already in the net stay as they are (converting twice changes nothing).

    Stays a plain, first-order layer (documented, never an error): grouped or depthwise convolutions,
    ``data_format='NHWC'`` convolutions, subclasses of the plain layers (their forward may differ), other
    layer types (``nn.EmbeddingLookup``, transposed convolutions, ...), layers whose weight has
    ``requires_grad=False`` (frozen: nothing to precondition), and ``nn.Conv1d`` under
    ``thor(..., factor_convention="gpu"/"ascend")``. No layer is special-cased by its name. The cell passed
    as the network is never replaced itself: a bare ``nn.Dense`` as the whole network stays plain (wrap it
    in a Cell). :func:`ms_optim.nn.thor` converts its net by the same rule, with its own settings.

    Examples:
        >>> from ms_optim import nn
        >>> from ms_optim.train_thor import ConvertNetUtils
        >>> net = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 2)])
        >>> [type(cell).__name__ for cell in ConvertNetUtils().convert_to_thor_net(net)]
        ['DenseThor', 'ReLU', 'DenseThor']
    """

    @classmethod
    def thor_candidates(cls, net: nn.Cell) -> List[Tuple[str, nn.Cell]]:
        """The layers THOR would precondition in ``net``, without converting anything.

        Args:
            net (Cell): the network.

        Returns:
            list[tuple[str, Cell]]: ``(name, cell)`` in ``net.cells_and_names()`` order: the trainable THOR
            layers already there and the plain layers :meth:`convert_to_thor_net` would convert (under
            ``factor_convention="kfc"``, the default on CPU).

        Raises:
            TypeError: if ``net`` is not a Cell.
        """
        check_type("net", net, nn.Cell, cls.__name__, what="a Cell")
        return thor_candidates(net)

    def convert_to_thor_net(self, net: nn.Cell) -> nn.Cell:
        """Replace, in place, every layer of ``net`` the class docstring names by its THOR layer.

        Args:
            net (Cell): the network to convert.

        Returns:
            Cell: ``net`` itself, converted.

        Raises:
            TypeError: if ``net`` is not a Cell.
        """
        check_type("net", net, nn.Cell, type(self).__name__, what="a Cell")
        self._convert(net, DEFAULT_SETTINGS, TapPool())
        return net

    def _convert(self, net: nn.Cell, settings: TapSettings, taps: TapPool) -> Set[int]:
        """Replace the plain layers :func:`thor_class_for` converts, building each with ``settings`` and a tap
        from ``taps``; return the ids of the new THOR layers."""
        names_in_use: Set[str] = {param.name for param in net.get_parameters()}
        paths = {id(cell): name for name, cell in net.cells_and_names()}
        replaced: Dict[int, ThorLayer] = {}
        self._convert_children(net, replaced, set(), (names_in_use, paths, settings, taps))
        if hasattr(net, "update_cell_type"):
            net.update_cell_type("second-order")
        return {id(layer) for layer in replaced.values()}

    def _convert_children(self, parent: nn.Cell, replaced: Dict[int, ThorLayer], visited: Set[int],
                          context: tuple) -> None:
        if id(parent) in visited:
            return
        visited.add(id(parent))
        names_in_use, paths, settings, taps = context
        for key, child in list(parent._cells.items()):  # pylint: disable=protected-access
            if child is None:
                continue
            new = replaced.get(id(child))
            if new is None:
                cls = thor_class_for(child, settings.convention)
                if cls is None:
                    self._convert_children(child, replaced, visited, context)
                    continue
                prefix = self._factor_prefix(cls, child, names_in_use, paths)
                new = cls.from_cell(child, prefix, settings, taps)
                self._copy_cell_state(child, new)
                replaced[id(child)] = new
            self._swap_child(parent, key, child, new)

    def _factor_prefix(self, cls: type, cell: nn.Cell, names_in_use: Set[str], paths: Dict[int, str]) -> str:
        """Name prefix of the new factor Parameters: the weight's prefix, or the cell's path if taken."""
        weight_name = cls.spec.weight(cell).name
        candidates = [weight_name[:weight_name.rfind(".") + 1]]
        path = paths.get(id(cell))
        if path:
            candidates.append(path + ".")
        base = candidates[-1]
        candidates += [f"{base}thor{i}." for i in range(1, 1000)]
        for prefix in candidates:
            names = [prefix + attr for attr in _FACTOR_ATTRS]
            if not any(name in names_in_use for name in names):
                names_in_use.update(names)
                return prefix
        raise RuntimeError(f"{type(self).__name__}: no free parameter name for the THOR factors of "
                           f"'{weight_name}'.")

    @staticmethod
    def _copy_cell_state(old: nn.Cell, new: ThorLayer) -> None:
        """Carry over the mixed-precision flags (to_float / amp) of the plain layer.

        The training mode is not carried over: THOR layers start in training mode (see
        ``ThorLayer``), so factors are collected even if the training cell never calls set_train();
        the user's later ``set_train`` on the net (Model.eval's too) governs from then on."""
        flags = getattr(old, "_func_graph_flags", {}) or {}
        precision = {k: v for k, v in flags.items() if k in _PRECISION_FLAGS and v}
        if precision:
            new.add_flags_recursive(**precision)

    @staticmethod
    def _swap_child(parent: nn.Cell, key: str, old: nn.Cell, new: nn.Cell) -> None:
        """Put ``new`` where ``parent`` holds ``old``: its child table and plain Python references to it
        (``SequentialCell.cell_list`` and other lists or tuples of cells), without renaming Parameters."""
        parent._cells[key] = new  # pylint: disable=protected-access
        for attr, value in list(parent.__dict__.items()):
            if attr in ("_cells", "_params"):
                continue
            if value is old:
                object.__setattr__(parent, attr, new)
            elif isinstance(value, list) and any(item is old for item in value):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
            elif isinstance(value, tuple) and any(item is old for item in value):
                object.__setattr__(parent, attr, tuple(new if item is old else item for item in value))
