"""THOR (Trace-based Hardware-driven layer-ORiented natural gradient) for MindSpore, from public ops.

How the pieces fit (the contract between the modules of this package):

``layers.py``  -- ``DenseThor``, ``Conv2dThor``, ``EmbeddingThor`` (all subclasses of ``ThorLayer``).
    Each layer *owns* its Kronecker factors, as non-trainable Parameters:
      * ``matrix_a_cov``: A = input covariance of the last THOR step (Dense: in x in; Conv2d:
        (C_in*kh*kw) x (C_in*kh*kw); Embedding: a (vocab_size,) vector, the diagonal of A);
      * ``matrix_g_cov``: G = output-gradient covariance of the last THOR step (out x out), as
        computed from the gradient that reaches the layer, i.e. still carrying the loss scale of that
        backward pass; the optimizer divides by ``factor_loss_scale**2`` (its Parameter: the static
        ``loss_scale``, or the live dynamic scale fed by the loss-scale cell via ``feed_loss_scale``);
      * ``thor_flag``: scalar bool Parameter. While it is True and the layer is in training mode
        (``cell.training``), the backward pass computes A (from the layer input) and G (from dL/ds)
        in one custom-bprop tap; while it is False neither is computed (no cost beyond a branch).
        The forward graph has no flag-dependent branch (one in GRAPH mode made a graph cycle when
        a layer is called twice in a step).
    ``ThorLayer.kind`` is ``"dense"``, ``"conv"`` or ``"embedding"``; ``ThorLayer.weight_param()``
    returns the Parameter whose gradient gets preconditioned (``weight`` / ``embedding_table``).
    ``ThorLayer.from_cell(cell)`` builds the THOR layer from a plain ``nn.Dense``/``nn.Conv2d``/
    ``nn.Embedding`` reusing its Parameter objects (names, values, dtypes kept).

``convert.py`` -- ``ConvertNetUtils().convert_to_thor_net(net)``: replaces every supported layer in
    place (nested Cells, SequentialCell, CellList), idempotent, unsupported layers left first-order.

``optimizer.py`` -- ``thor(net, learning_rate, damping, momentum, ...)`` validates every argument,
    THEN converts ``net``, THEN builds the single optimizer Cell (``ThorOptimizer``). The optimizer
    finds the THOR layers by walking ``net.cells_and_names()`` (isinstance ``ThorLayer``, no name
    matching) and owns the schedule: step t (its ``global_step``) is a THOR step iff
    ``t % frequency == 0``. At the end of every step it writes ``(t + 1) % frequency == 0`` into every
    layer's ``thor_flag``, so the schedule holds in every calling path (``TrainOneStepCell``, ``Model``,
    ``ModelThor`` sink or not) with no Python-side toggling. It also owns the damped inverses (its
    own Parameters) and the momentum buffers (``moments.``); ``get_frequency()`` returns frequency.

``preconditioner.py`` -- damping, (blocked) inverses and the G^-1 dW A^-1 products, pure functions
    of tensors used by the optimizer.

``parallel.py`` -- ``FactorAllReduce``: mean all-reduce of factors in fusion groups split at
    ``split_indices``; identity on a single device.

``model.py`` -- ``ModelThor`` (the dataset-sink loop, implemented here for every backend) and (kept beside it, since it only builds a ModelThor)
    ``ConvertModelUtils.convert_to_thor_model``.

``schedules.py`` -- the model zoo's learning-rate and damping generators.
"""
