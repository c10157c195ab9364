"""THOR (Trace-based Hardware-driven layer-ORiented natural gradient) for MindSpore, from public ops.

Private implementation package (the public names are ``ms_optim.thor``/``ms_optim.nn.thor``, the THOR
layers in ``ms_optim.nn`` and ``ms_optim.train_thor``).

The path of a ``thor(net, ...)`` call, and the module of each step:

``factory.py`` -- ``thor()``: ``config.validate_thor`` (every argument checked once, into a frozen
    ``ThorConfig``), then ``build_thor``: ``convert.convert_net`` (the layers, complete), then the optimizer.

``config.py`` -- ``ThorConfig`` and ``validate_thor``; the data-parallel group size is read there, once.

``modes.py`` -- the named constants: conventions, inverse modes, layer kinds, gradient treatments, G rules,
    inversion strategies.

``kinds.py`` -- one spec per layer kind (Dense, Conv2d, Conv1d, Embedding; the LayerNorm rule): its plain
    type, dims, gradient treatment, convention multipliers and factor computation (composite and fused).
    A new kind is a spec and one line of registration, plus its public THOR layer class.

``layer_base.py``, ``layers.py`` -- ``ThorLayer`` and ``DenseThor``, ``Conv2dThor``, ``Conv1dThor``,
    ``EmbeddingThor``: state (``matrix_a_cov``, ``matrix_g_cov``, ``thor_flag``) and forward only.

``taps.py`` -- ``FactorTap``, one class over a kind's spec: the identity whose ``bprop`` computes and
    stores a layer's factors on THOR steps; ``TapSettings`` (convention, batch size, block width, schedule
    guard) given when a layer is made; ``ScheduleGuard``.

``factors.py``, ``factor_kernels.py`` -- the factor math (composite ops) and THOR's fused CPU ops
    (``FactorKernels``); ``factors.factor_blocks`` is the one block geometry.

``conventions.py`` -- ``factor_convention``: MindSpore's GPU and Ascend normalisations, or KFC; ``"auto"``
    resolves by device target.

``convert.py`` -- THE rule of which cells become THOR layers (``thor_class_for``, ``thor_candidates``) and
    ``convert_net``/``ConvertNetUtils().convert_to_thor_net``, which apply it in place.

``optimizer.py`` -- ``ThorOptimizer(net, layers, config)``: one complete ``LayerSlot`` per layer, one
    inversion strategy, and the step: schedule, on a THOR step ``self.inversion(...)``, update, flags.

``slot.py`` -- ``LayerSlot`` (a layer's constants, its inverse rule and stored inverses) and
    ``invert_layer``, the damped inversion of one layer's factors.

``inversion.py`` -- ``choose_strategy``/``build_inversion``: the strategy Cell, chosen when the optimizer is
    built, all with one call ``strategy(anchor, lam, factor_loss_scale)``:
    ``grouped.py`` (``BATCHED``: every layer at once, fused per factor on CPU, batched per block width
    elsewhere), ``layerwise.py`` (``PER_LAYER``: MindSpore's device rules, the trace rule), ``shared.py``
    (``SHARED``: ``distribute_inverses`` on R > 1 ranks, with ``sharing.py``'s owners and counter),
    ``averaging.py`` (``AVERAGED``: "gpu"/"ascend" on R > 1 ranks, MindSpore's inverse averaging).

``damping.py`` -- the damping rule, chosen when the optimizer is built: ``ScheduledDamping`` (the damping
    Tensor, MindSpore's THOR) or ``adaptive.py``'s ``AdaptiveDamping`` (``damping="adaptive"``: the
    Levenberg-Marquardt rule on the reduction ratio, the initial-damping heuristic, the re-inversion when the
    damping changes), whose predicted change is ``quad_model.py``'s (from the stored Kronecker factors) and
    whose measured change comes from ``probe.py``: the extra forward pass the training cells run after the
    optimizer (``LossProbe``; ``TrainOneStepCell``, ``ms_optim.nn``'s).

``adaptive_lr.py`` -- ``learning_rate="adaptive"``: ``AdaptiveLrThorOptimizer`` (chosen by
    ``factory.build_thor``), whose update is ``QuadraticStep``'s: step size and momentum from the 2x2
    quadratic model over the new preconditioned direction and the previous update (the stored Kronecker
    factors plus the damping), its fallbacks and the ``kl_clip`` trust region.

``device_rules.py`` -- what MindSpore's ``ThorGpu``/``ThorAscend`` do to the inverses (``InverseRule`` per
    layer).

``trace.py`` -- THOR's trace rule (``trace_thresholds``): its state and the per-layer decision.

``preconditioner.py`` -- damping, (blocked) inverses and the G^-1 dW A^-1 products, pure functions.

``update.py`` -- the rules after preconditioning (weight decay, unit-norm clip, momentum, Nesterov).

``parallel.py`` -- the collectives' one builder (``sum_allreduce``) and ``FactorAllReduce``, the mean
    all-reduce of factors in fusion groups split at ``split_indices``.

``kl_clip.py`` -- KL clipping (``kl_clip``).

``model.py`` -- ``ModelThor`` (the dataset-sink loop, implemented here for every backend) and
    ``ConvertModelUtils.convert_to_thor_model``.

``schedules.py`` -- the model zoo's learning-rate and damping generators.

The schedule (the contract between the optimizer and the layers, stated here only). The optimizer
owns the step counter t (its ``global_step``): step t is a THOR step iff ``t % frequency == 0``.
A layer computes A and G in the backward pass of a step only while its ``thor_flag`` is True and
it is in training mode. At the end of every step the optimizer writes ``(t + 1) % frequency == 0``
into every layer's ``thor_flag``, so the flags are right for the next step in every calling path
(``TrainOneStepCell``, ``Model``, ``ModelThor`` sink or not), with no Python-side toggling. The
flags start True (step 0 is a THOR step); ``ThorOptimizer.sync_thor_flags()`` re-derives them from
``global_step`` (after loading a checkpoint without them). A step the caller skips (loss-scale
overflow: the optimizer is not called) changes nothing: parameters, moments, inverses,
``global_step`` and the flags stay, so the retried step is again a THOR step if the skipped one was.
With ``trace_thresholds`` the THOR steps are the same (every layer collects its factors on each);
only whether a layer is re-inverted is decided per THOR step (``trace.py``).
"""
