"""The THOR training Model (``ModelThor``) and ``ConvertModelUtils.convert_to_thor_model``, which makes one.

``ModelThor`` is a ``mindspore.train.Model`` whose dataset-sink loop is implemented here, on the host, the
same on every backend, and whose training cell is built with the portable loss-scale cell; what a user sees
of it is stated once, in its class docstring.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Optional, Tuple

import numpy as np
from mindspore import context, nn
from mindspore.train import amp
from mindspore.train.callback import RunContext
from mindspore.train.loss_scale_manager import LossScaleManager
from mindspore.train.model import Model

from ms_optim._float16_add import float16_add_via_float32
from ms_optim._loss_scale_checks import check_loss_scale_manager
from ms_optim._memory import release_after_compile
from ms_optim._thor.step.optimizer import ThorOptimizer
from ms_optim._validation import check_bool, check_int, check_type, describe
from ms_optim.loss_scale import TrainOneStepCell, TrainOneStepWithLossScaleCell

__all__ = ["ModelThor", "ConvertModelUtils"]


def _is_thor_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is ms_optim's THOR optimizer."""
    return isinstance(optimizer, ThorOptimizer)


def _resolve_amp_level(level: str) -> str:
    """``auto`` means O2 on GPU, O3 on Ascend, O0 elsewhere (MindSpore's recommendation)."""
    if level != "auto":
        return level
    target = context.get_context("device_target")
    return {"GPU": "O2", "Ascend": "O3"}.get(target, "O0")


def _cycle(dataset, num_epochs: int) -> Iterator[Tuple]:
    """Yield the dataset's rows as one stream over ``num_epochs`` dataset epochs."""
    iterator = dataset.create_tuple_iterator(num_epochs=num_epochs, do_copy=True)
    for _ in range(num_epochs):
        for row in iterator:
            yield tuple(row)


class ModelThor(Model):
    """MindSpore's ``Model`` with a dataset-sink loop and a loss-scaled training cell that run everywhere.

    ``ModelThor`` trains any network and optimizer (it is tested with ``nn.Momentum`` as well as with THOR);
    :meth:`ConvertModelUtils.convert_to_thor_model` returns one for a THOR optimizer. ``train``, ``eval``
    and ``predict`` are ``Model``'s, with two differences:

    * ``dataset_sink_mode=True`` runs, on CPU, GPU and Ascend alike, ``sink_size`` steps per epoch (the whole
      dataset when ``sink_size == -1``), reading the dataset as one continuous stream. Callbacks see
      MindSpore's sink semantics: ``step_begin``/``step_end`` once per sink, ``cur_step_num`` advancing by
      ``sink_size``, ``net_outputs`` the output of the sink's last step. (MindSpore's ``Model`` falls back
      to step-by-step training on CPU.) ``dataset_sink_mode=False`` is MindSpore's step-by-step loop. The
      THOR schedule belongs to the optimizer, so both loops and any ``sink_size`` train alike.
    * The training cell is built as ``Model`` builds it (``amp_level``, ``keep_batchnorm_fp32``, loss
      wrapping), with ms_optim's cells: :class:`ms_optim.nn.TrainOneStepCell` without a manager or with
      ``FixedLossScaleManager(s, drop_overflow_update=False)`` (sens :math:`s`, divided out by THOR's
      ``loss_scale``); :class:`ms_optim.nn.TrainOneStepWithLossScaleCell` for ``DynamicLossScaleManager``
      and ``FixedLossScaleManager(drop_overflow_update=True)``, which skips overflowing steps on CPU too.
      A manager whose loss scale is NaN, infinite or <= 0 is refused before anything is built.

    Once compiled, the training cell returns the memory its compilation freed to the operating system
    (:func:`ms_optim.release_freed_memory`); on CPU, graphs add float16 tensors through float32
    (:func:`ms_optim.float16_add_via_float32`).

    Args:
        network (Cell): the network, or a ready training cell when ``optimizer`` is None.
        loss_fn (Cell): the loss; None when ``network`` computes it. Default: None.
        optimizer (Cell): the optimizer (usually :func:`ms_optim.nn.thor`'s). Default: None.
        metrics (Union[dict, set]): evaluation metrics. Default: None.
        eval_network (Cell): the evaluation network. Default: None.
        eval_indexes (list): positions of loss, prediction and label in ``eval_network``'s outputs.
            Default: None.
        amp_level (str): ``"O0"``, ``"O1"``, ``"O2"``, ``"O3"`` or ``"auto"`` (O2 on GPU, O3 on Ascend, O0
            elsewhere). Default: ``"O0"``.
        **kwargs: ``loss_scale_manager`` and ``keep_batchnorm_fp32``, as ``Model``'s.

    ``frequency`` is the THOR optimizer's frequency (None for other optimizers).

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> from ms_optim.train_thor import ModelThor
        >>> net = nn.SequentialCell([nn.Dense(4, 2)])
        >>> opt = nn.thor(net, ms.Tensor(0.1), ms.Tensor(0.03), 0.9, frequency=10)
        >>> ModelThor(net, loss_fn=nn.MSELoss(), optimizer=opt).frequency
        10
    """

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", **kwargs):
        self._sink_request: Optional[int] = None
        super().__init__(network, loss_fn, optimizer, metrics, eval_network, eval_indexes, amp_level,
                         **kwargs)
        opt = optimizer
        if opt is None and isinstance(network, nn.TrainOneStepCell):
            opt = network.optimizer
        get_frequency = getattr(opt, "get_frequency", None)
        self.frequency: Optional[int] = int(get_frequency()) if callable(get_frequency) else None

    # ------------------------------------------------------------------ building the training cell
    def _loss_scale_manager_for(self, level: str):
        if self._loss_scale_manager_set:
            return self._loss_scale_manager
        if level == "O2":  # MindSpore's O2 default
            return amp.DynamicLossScaleManager()
        return None

    def _build_train_network(self):
        """The training cell (:meth:`_build_step_cell`), releasing its compilation's freed memory once
        compiled; on CPU, float16 ``+`` goes through float32 in every graph compiled from then on."""
        if context.get_context("device_target") == "CPU":
            float16_add_via_float32()
        return release_after_compile(self._build_step_cell())

    def _build_step_cell(self):
        """Build the training cell as ``Model`` does, with a loss-scale cell that runs everywhere."""
        if self._optimizer is None:
            return super()._build_train_network()
        level = _resolve_amp_level(self._amp_level)
        manager = self._loss_scale_manager_for(level)
        check_loss_scale_manager(manager)  # as Model's build_train_network: before anything is cast or built
        amp_config = {"loss_scale_manager": None}
        if self._keep_bn_fp32 is not None:
            amp_config["keep_batchnorm_fp32"] = self._keep_bn_fp32
        # MindSpore's own builder applies the precision level and wraps the loss; we keep only its
        # loss network and choose the step cell ourselves.
        plain = amp.build_train_network(self._network, self._optimizer, self._loss_fn, level=level,
                                        **amp_config)
        loss_network = plain.network
        if manager is None:
            return TrainOneStepCell(loss_network, self._optimizer).set_train()
        update_cell = manager.get_update_cell()
        if update_cell is None:
            return TrainOneStepCell(loss_network, self._optimizer,
                                    float(manager.get_loss_scale())).set_train()
        return TrainOneStepWithLossScaleCell(loss_network, self._optimizer,
                                             scale_sense=update_cell).set_train()

    # ------------------------------------------------------------------ training loops
    def _train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=True, sink_size=-1,
               initial_epoch=0, **kwargs):
        """Route sink-mode training to this class's own sink loop on every backend."""
        if dataset_sink_mode:
            self._sink_request = sink_size if sink_size > 0 else train_dataset.get_dataset_size()
        else:
            self._sink_request = None
        try:
            return super()._train(epoch, train_dataset, callbacks=callbacks,
                                  dataset_sink_mode=dataset_sink_mode, sink_size=sink_size,
                                  initial_epoch=initial_epoch, **kwargs)
        finally:
            self._sink_request = None

    def _train_process(self, epoch, train_dataset, list_callback=None, cb_params=None, initial_epoch=0,
                       valid_infos=None, **kwargs):
        # MindSpore calls this for non-sink training, and for sink training on CPU.
        if self._sink_request is not None:
            return self._thor_sink_process(epoch, train_dataset, list_callback, cb_params, self._sink_request,
                                           initial_epoch, valid_infos)
        return super()._train_process(epoch, train_dataset, list_callback, cb_params, initial_epoch,
                                      valid_infos, **kwargs)

    def _train_dataset_sink_process(self, epoch, train_dataset, list_callback=None, cb_params=None,
                                    sink_size=-1, initial_epoch=0, valid_infos=None, **kwargs):
        # MindSpore calls this for sink training on GPU/Ascend: use the same loop there.
        if sink_size is None or sink_size <= 0:
            sink_size = train_dataset.get_dataset_size()
        return self._thor_sink_process(epoch, train_dataset, list_callback, cb_params, sink_size,
                                       initial_epoch, valid_infos)

    def _after_step(self, outputs) -> None:
        """Host-side loss-scale bookkeeping, as MindSpore's step-by-step loop does it."""
        manager = self._loss_scale_manager
        if manager is not None and manager.get_drop_overflow_update() and isinstance(outputs, (tuple, list)):
            manager.update_loss_scale(bool(np.all(outputs[1].asnumpy())))

    def _thor_sink_process(self, epoch, train_dataset, list_callback, cb_params, sink_size, initial_epoch,
                           valid_infos):
        """Sink loop: ``epoch - initial_epoch`` sinks of ``sink_size`` steps over one data stream."""
        dataset_size = train_dataset.get_dataset_size()
        num_sinks = epoch - initial_epoch
        data_epochs = max(1, math.ceil(num_sinks * sink_size / dataset_size))
        cb_params.sink_size = sink_size
        cb_params.batch_num = sink_size
        cb_params.dataset_sink_mode = True
        run_context = RunContext(cb_params)
        list_callback.on_train_begin(run_context)
        stream = _cycle(train_dataset, data_epochs)
        network = self._train_network
        network.set_train(True)
        network.phase = "train"
        self._backbone_is_train = True
        cb_params.train_network = network
        self.epoch_iter = 0
        for i in range(initial_epoch, epoch):
            cb_params.cur_epoch_num = i + 1
            self._current_epoch_num = cb_params.cur_epoch_num
            self._current_step_num = 0
            list_callback.on_train_epoch_begin(run_context)
            cb_params.cur_step_num += sink_size
            self._current_step_num = sink_size
            list_callback.on_train_step_begin(run_context)
            outputs = None
            for _ in range(sink_size):
                inputs = next(stream)
                if self._loss_fn is not None and len(inputs) != 2:
                    raise ValueError("When 'loss_fn' is not None, 'train_dataset' should return two "
                                     f"elements, but got {len(inputs)}.")
                cb_params.train_dataset_element = inputs
                network = self._check_network_mode(network, True)
                outputs = network(*inputs)
                self._after_step(outputs)
            cb_params.net_outputs = outputs
            list_callback.on_train_step_end(run_context)
            self._eval_during_train(valid_infos, cb_params, list_callback)
            list_callback.on_train_epoch_end(run_context)
            cb_params.pop("metrics", None)
            cb_params.pop("eval_results", None)
            self.epoch_iter += 1
            if run_context.get_stop_requested():
                break
        stream.close()
        list_callback.on_train_end(run_context)


def _user_eval_network(model: Any):
    """The evaluation network a user gave ``model`` (None when Model built it from network+loss)."""
    eval_net = getattr(model, "_eval_network", None)
    if eval_net is None:
        return None, None
    if (isinstance(eval_net, nn.WithEvalCell)
            and getattr(eval_net, "_network", None) is getattr(model, "_network", None)):
        return None, None
    return eval_net, getattr(model, "_eval_indexes", None)


_AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")


def _check_convert_arguments(network, loss_fn, metrics, amp_level, loss_scale_manager, keep_batchnorm_fp32,
                             frequency, thor_opt) -> None:
    """Every argument of ``convert_to_thor_model``, before anything is built or cast."""
    name = "ConvertModelUtils"
    check_type("network", network, nn.Cell, name, what="a Cell")
    if loss_fn is not None:
        check_type("loss_fn", loss_fn, nn.Cell, name, what="a Cell or None")
    if metrics is not None:
        check_type("metrics", metrics, (dict, set), name, what="a dict, a set or None")
    check_type("amp_level", amp_level, str, name, what="a str")
    if amp_level not in _AMP_LEVELS:
        raise ValueError(f"For '{name}', the argument 'amp_level' must be one of {list(_AMP_LEVELS)}, "
                         f"but got {describe(amp_level)}.")
    if loss_scale_manager is not None:
        check_type("loss_scale_manager", loss_scale_manager, LossScaleManager, name,
                   what="a LossScaleManager (FixedLossScaleManager, DynamicLossScaleManager) or None")
    check_bool("keep_batchnorm_fp32", keep_batchnorm_fp32, name)
    if frequency is not None:
        check_int("frequency", frequency, name)
        if frequency != thor_opt.get_frequency():
            raise ValueError(f"For '{name}', the argument 'frequency' ({frequency}) must equal "
                             f"the THOR optimizer's frequency ({thor_opt.get_frequency()}): pass the same "
                             f"value to thor(..., frequency=...) or leave 'frequency' out here.")


class ConvertModelUtils:
    """Turns a ``Model`` whose optimizer is THOR into a :class:`ModelThor`, as MindSpore's ConvertModelUtils.

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> from ms_optim.train_thor import ConvertModelUtils
        >>> net = nn.SequentialCell([nn.Dense(4, 2)])
        >>> loss = nn.MSELoss()
        >>> opt = nn.thor(net, ms.Tensor(0.1), ms.Tensor(0.03), 0.9, frequency=10)
        >>> model = ms.Model(net, loss_fn=loss, optimizer=opt)
        >>> model = ConvertModelUtils().convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
        >>> type(model).__name__
        'ModelThor'
    """

    @staticmethod
    def convert_to_thor_model(model, network, loss_fn=None, optimizer=None, metrics=None, amp_level="O0",
                              loss_scale_manager=None, keep_batchnorm_fp32=False, *, frequency=None):
        """A :class:`ModelThor` built from these arguments when ``optimizer`` is :func:`ms_optim.nn.thor`'s
        (or ``network`` is a ``TrainOneStepCell`` around one); else ``model`` unchanged.

        Args:
            model (Model): the model to convert (returned as is for other optimizers). An evaluation
                network the user passed to it is carried over.
            network (Cell): the network (or a ``TrainOneStepCell``).
            loss_fn (Cell): the loss. Default: None.
            optimizer (Cell): the optimizer. Default: None.
            metrics (Union[dict, set]): evaluation metrics. Default: None.
            amp_level (str): ``"O0"``, ``"O1"``, ``"O2"``, ``"O3"`` or ``"auto"``. Default: ``"O0"``.
            loss_scale_manager (LossScaleManager): None, ``FixedLossScaleManager`` or
                ``DynamicLossScaleManager``. Default: None.
            keep_batchnorm_fp32 (bool): keep BatchNorm in float32 under O2/O3. Default: False.
            frequency (int): keyword-only, accepted for older scripts that pass it here; it must equal
                the THOR optimizer's ``frequency`` (the optimizer owns the schedule). Default: None.

        When the model is converted, every argument is checked first: a refused call changes
        nothing (no cast, no new cell, ``model``/``network``/``optimizer`` as they were).

        Raises:
            TypeError: if ``network`` is not a Cell, ``loss_fn`` not a Cell or None, ``metrics`` not a
                dict/set/None, ``amp_level`` not a str, ``loss_scale_manager`` not a LossScaleManager or
                None, ``keep_batchnorm_fp32`` not a bool, ``frequency`` not an int.
            ValueError: if ``amp_level`` is not "O0"/"O1"/"O2"/"O3"/"auto"; if ``frequency`` differs
                from the THOR optimizer's (both values named).

        Returns:
            Model: a ``ModelThor`` or ``model``.
        """
        thor_opt = network.optimizer if isinstance(network, nn.TrainOneStepCell) else optimizer
        if _is_thor_optimizer(thor_opt):
            _check_convert_arguments(network, loss_fn, metrics, amp_level, loss_scale_manager,
                                     keep_batchnorm_fp32, frequency, thor_opt)
        if isinstance(network, nn.TrainOneStepCell) and _is_thor_optimizer(network.optimizer):
            eval_net, eval_indexes = _user_eval_network(model)
            if eval_net is None:  # a training cell alone has no loss to build an evaluation network from
                return ModelThor(network=network)
            return ModelThor(network=network, metrics=metrics, eval_network=eval_net,
                             eval_indexes=eval_indexes)
        if not _is_thor_optimizer(optimizer):
            return model
        eval_net, eval_indexes = _user_eval_network(model)
        return ModelThor(network=network, loss_fn=loss_fn, optimizer=optimizer, metrics=metrics,
                         eval_network=eval_net, eval_indexes=eval_indexes, amp_level=amp_level,
                         loss_scale_manager=loss_scale_manager, keep_batchnorm_fp32=keep_batchnorm_fp32)
