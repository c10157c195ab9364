"""THOR (Trace-based Hardware-driven layer-ORiented natural gradient) for MindSpore, from public ops.

Private implementation package (the public names are ``ms_optim.thor``/``ms_optim.nn.thor``, the THOR
layers in ``ms_optim.nn``, ``ms_optim.train_thor`` and the training cells of ``ms_optim.loss_scale``).

The path of a ``thor(net, ...)`` call, from the top down:

``factory.py`` -- ``thor()``: ``validate.validate_thor`` (every argument checked once), then ``build_thor``:
    ``net.convert.convert_net`` (the layers, complete), then ``step.optimizer.ThorOptimizer``.

``config.py`` -- ``ThorConfig``, the frozen record of the arguments with the modes named (a leaf: every part
    reads it). ``validate.py`` -- ``validate_thor``; the data-parallel group size is read there, once.

``modes.py`` -- the named constants: modes, conventions, inverse modes, layer kinds, G rules, strategies.

``parallel.py`` -- the collectives' one builder (``sum_allreduce``), ``RankMean`` and ``FactorAllReduce``.

``model.py`` -- ``ModelThor`` (the dataset-sink loop, implemented here for every backend) and
    ``ConvertModelUtils.convert_to_thor_model``. ``schedules.py`` -- the model zoo's schedule generators.

``net/`` -- the net side: what a layer kind is and does.
    ``kinds.py`` (one spec per kind, owning both how its factors are collected and how its curvature is
    applied; the LayerNorm and plain specs), ``curvature.py`` (the curvature forms: ``apply(slot, vector,
    power, step)``), ``blocks.py`` (products with block-diagonal matrices), ``layer_base.py``/``layers.py``
    (the THOR layers: state and forward), ``taps.py`` (the backward-pass tap that stores the factors),
    ``factors.py``/``factor_kernels.py`` (the factor math, composite and fused), ``conventions.py``,
    ``layer_args.py``, ``convert.py`` (THE rule of which cells become THOR layers).

``inversion/`` -- how a THOR step refreshes the inverses: ONE strategy chosen at build (``strategy.py``):
    ``batched.py`` (every layer at once), ``per_layer.py`` (layer by layer: device rules, trace rule),
    ``shared.py`` (``distribute_inverses``: one owner per layer, ``owners.py``), ``averaged.py``
    ("gpu"/"ascend" on R > 1 ranks); ``slot.py`` (the optimizer's per-layer record and one layer's inversion),
    ``preconditioner.py`` (damped inverses and their acceptance), ``device_rules.py`` (MindSpore's GPU and
    Ascend rules, keyed on spec attributes), ``trace.py`` (the trace rule).

``step/`` -- the step: ``optimizer.py`` (``ThorOptimizer``: schedule, damping rule, inversion, step rule,
    flags; ``finish_step`` for the training cell), ``table.py`` (the parameters' specs, slots and flags),
    ``damping.py`` (the damping rules: the schedule, Levenberg-Marquardt), ``momentum_rule.py`` (the step of a
    learning-rate schedule), ``quadratic_rule.py`` (``learning_rate="adaptive"``), ``quad_model.py`` (THE
    quadratic model and its solve), ``update.py`` (the per-parameter rules), ``kl_clip.py``.

The schedule (the contract between the optimizer and the layers, stated here only). The optimizer owns the
step counter t (its ``global_step``): step t is a THOR step iff ``t % frequency == 0``. A layer computes A and
G in the backward pass of a step only while its ``thor_flag`` is True and it is in training mode. At the end
of every step the optimizer writes ``(t + 1) % frequency == 0`` into every layer's ``thor_flag``, so the flags
are right for the next step in every calling path (``TrainOneStepCell``, ``Model``, ``ModelThor`` sink or
not), with no Python-side toggling. The flags start True (step 0 is a THOR step);
``ThorOptimizer.sync_thor_flags()`` re-derives them from ``global_step`` (after loading a checkpoint without
them). A step the caller skips (loss-scale overflow: the optimizer is not called) changes nothing: parameters,
moments, inverses, ``global_step`` and the flags stay, so the retried step is again a THOR step if the skipped
one was. With ``trace_thresholds`` the THOR steps are the same (every layer collects its factors on each);
only whether a layer is re-inverted is decided per THOR step (``inversion/trace.py``).
"""
