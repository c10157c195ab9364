"""THOR (Trace-based Hardware-driven layer-ORiented natural gradient) for MindSpore, from public ops.

Private implementation package (the public names are ``ms_optim.thor``/``ms_optim.nn.thor``, the THOR
layers in ``ms_optim.nn`` and ``ms_optim.train_thor``). How the modules fit:

``kinds.py`` -- one spec per layer kind (Dense, Conv2d, Conv1d, Embedding; the LayerNorm rule's facts):
    the plain type and structure rule, the weight, the factor sizes, whether A is diagonal, the gradient
    treatment, the conventions it converts under, the convention multipliers and the factor computation
    (composite and fused). A kind is a spec plus one ``@kinds.register`` line on its THOR layer class.

``factors.py`` -- the factor math the specs call: ``<kind>_a(layer input, ...) -> A`` and
    ``<kind>_g(dL/ds) -> G``, the conv im2col and ``conv_output_geometry``, and the stored (diagonal
    block) form, whose geometry ``factor_blocks`` computes for everyone. The formulas and their
    normalisation are documented there.

``taps.py`` -- ``FactorTap``, the one backward-pass tap class, over a spec, the layer's geometry and the
    ``TapSettings`` of its conversion (convention, ``batch_size``, block width, schedule guard): an
    identity whose ``bprop`` computes and stores a layer's factors on THOR steps; ``TapPool`` shares one
    tap among the layers of a conversion that compute alike.

``conventions.py`` -- ``thor(..., factor_convention=...)``: MindSpore's GPU and Ascend normalisations
    of A, G and the damping (or KFC); ``"auto"`` resolves by device target. The exact formulas, and what
    of MindSpore's is not reproduced, are there (each kind's multipliers are in ``kinds.py``).

``factor_kernels.py`` -- the fused CPU ops (``FactorKernels``: the factors' grams and counts, the blocked
    preconditioning and inversions), compiled C++ behind ``ops.Custom``.

``layer_base.py``, ``layers.py`` -- ``ThorLayer`` and ``DenseThor``, ``Conv2dThor``, ``Conv1dThor``,
    ``EmbeddingThor``: state and forward only. Each layer owns, as non-trainable Parameters,
    ``matrix_a_cov`` (A), ``matrix_g_cov`` (G, carrying the square of the loss scale of its backward
    pass) and ``thor_flag``; ``ThorLayer.from_cell(cell, settings=...)`` builds one from a plain layer
    reusing its Parameters, complete (factor shapes of its block width, its tap's settings).

``convert.py`` -- THE rule of which cells become THOR layers (``thor_class_for(cell, convention)``:
    a registered spec's structure rule, the spec's conventions, weight ``requires_grad``;
    ``thor_candidates``/``count_thor_cells``), ``convert_net(net, settings)``, which applies it in place
    with ``thor()``'s settings and returns the layers, and ``ConvertNetUtils().convert_to_thor_net(net)``
    (MindSpore's, the default settings).

``factory.py`` -- ``thor(net, learning_rate, damping, momentum, ...)``: validates every argument,
    THEN converts ``net`` (``convert_net``, the layers built with their final settings), THEN builds the
    optimizer. Nothing else converts, and nothing touches the layers after conversion.

``optimizer.py`` -- ``ThorOptimizer``: state (one ``LayerSlot`` per THOR layer, the inverses, the
    momentum buffers ``moments.``) and the step (update rule in its docstring). It receives the
    converted net and its layers; it never validates or converts.

``slot.py`` -- ``LayerSlot`` (the optimizer's per-layer constants and stored inverses) and
    ``layer_inverses``/``invert_layer``, the damped inversion of one layer's factors on a THOR step.

``device_rules.py`` -- what MindSpore's ``ThorGpu``/``ThorAscend`` do to the inverses under "gpu"/"ascend"
    (GPU's embedding product ``L^-1 L^-1``, Ascend's max-abs scale and 2-output ``Ginv = I``), per layer.

``averaging.py`` -- their data-parallel rule: every rank inverts its own factors and the inverses are
    mean-all-reduced (``"kfc"`` averages the factors instead, ``parallel.py``).

``grouped.py`` -- ``GroupedInversion``: a THOR step's damped inversions when every layer is inverted
    (no trace rule, no inverse sharing): on CPU one fused op per factor (damp, invert in double, check,
    store: ``MsOptimBlockInverse``); elsewhere the factors' diagonal blocks of one width, of every layer, as
    batched inversions of chunks of whole factors (``CHUNK_BYTES``, one chunk after the other). Either way
    the compiled graph holds no branch per layer and the step's temporaries do not grow with depth.

``trace.py`` -- THOR's trace rule (``trace_thresholds``): per layer, from the change of the trace of
    its FIM block since its last inversion, whether a THOR step re-inverts it; its state Parameters.

``preconditioner.py`` -- damping, (blocked) inverses and the G^-1 dW A^-1 products, pure functions.

``update.py`` -- the rules after preconditioning (weight decay, unit-norm clip, momentum, Nesterov) and
    ``sequential_step``: precondition, decay and momentum one parameter after the other.

``parallel.py`` -- ``FactorAllReduce``: mean all-reduce of factors in fusion groups split at
    ``split_indices``; identity on a single device.

``sharing.py`` -- ``InverseSharing`` (``distribute_inverses``): which rank inverts which layer
    (cost-balanced, the same on every rank), the inversion counter, and the AllReduce that shares the
    inverses.

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
