"""THOR's checkpoints are a format users keep: ``tests/data/thor_<name>.ckpt`` (written by
``tests/data/make_thor_checkpoints.py``: THOR, ``damping="adaptive"`` and recipe-free THOR after 4 steps) load
into today's optimizers, every entry finding its Parameter, and the run goes on: as the saved run did (its
parameters 2 steps later, ``thor_checkpoints.npz``) where the update rule is the same, finite everywhere."""
import os
import sys

import mindspore as ms
import numpy as np
import pytest
from support import REPO

DATA = os.path.join(REPO, "tests", "data")
sys.path.insert(0, DATA)

import make_thor_checkpoints as made  # noqa: E402

#: Parameters today's optimizers hold that such a checkpoint may lack (each starts from its initial value):
#: the count of steps taken back and, with damping="adaptive" and a learning rate, the copy a failed step is
#: taken back from, and the growth of the damping after steps taken back in a row
NEW_STATE = ("thor_rejected_steps", "thor_rejection_growth", "thor_before.")
#: entries of such a checkpoint that today's optimizers hold under another name: the loss scale of the stored G
#: that the adaptive step read, now the one ``thor_curvature_loss_scale`` the damping rule reads too
MERGED = {"thor_step_curvature_loss_scale": "thor_curvature_loss_scale"}


@pytest.mark.parametrize("name", made.CONFIGS)
def test_checkpoint_loads_and_the_run_goes_on(mode, name):
    saved = ms.load_checkpoint(os.path.join(DATA, f"thor_{name}.ckpt"))
    net, opt, cell = made.build(name)
    for param in net.trainable_params():  # other weights than the checkpoint's: all must be loaded
        param.set_data(param * 0.5)
    params_not_loaded, ckpt_not_loaded = ms.load_param_into_net(cell, saved)
    for entry in ckpt_not_loaded:  # every saved entry has its Parameter, or one holding the same value
        assert entry in MERGED, ckpt_not_loaded
        assert float(saved[entry].asnumpy()) == float(saved[MERGED[entry]].asnumpy()), entry
    assert all(p.startswith(NEW_STATE) for p in params_not_loaded), params_not_loaded
    for x, y in made.batches()[4:]:
        assert np.isfinite(float(cell(x, y).asnumpy()))
    expected = np.load(os.path.join(DATA, "thor_checkpoints.npz"))
    for param in net.trainable_params():
        value = param.asnumpy()
        assert np.all(np.isfinite(value)), param.name
        if name != "damping":  # damping="adaptive" now also measures and may take back the steps in between
            np.testing.assert_allclose(value, expected[f"{name}/{param.name}"], rtol=1e-4, atol=1e-6,
                                       err_msg=param.name)
    for pname, param in opt.parameters_and_names():
        assert np.all(np.isfinite(param.asnumpy())), pname
