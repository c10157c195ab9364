"""A THOR training script written for MindSpore only (no ms_optim import anywhere).

It follows MindSpore's documented THOR example: ``mindspore.nn.thor`` with per-step lr/damping
Tensors, ``mindspore.ConvertModelUtils.convert_to_thor_model`` with a FixedLossScaleManager, amp
level O2 and metrics, data-sink training. MindSpore 2.10 cannot run it on CPU; under
``python -m ms_optim.run`` it runs unmodified. It prints what it trained with and whether the
parameters changed and stayed finite, and exits with ``--exit-code``.
"""
import argparse
import sys

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import LossMonitor

parser = argparse.ArgumentParser(description="tiny THOR run written against mindspore.nn.thor")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--frequency", type=int, default=2)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(0)


class SmallNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 6 * 6, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def make_dataset(batch, steps):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * steps, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(batch * steps, -1).sum(axis=1) > 0).astype(np.int32) + (x[:, 0, 0, 0] > 1).astype(np.int32)
    rows = [(x[i], np.asarray(y[i], np.int32)) for i in range(len(x))]  # arrays, not numpy scalars
    return ds.GeneratorDataset(rows, column_names=["image", "label"], shuffle=False).batch(batch)


net = SmallNet()
before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
lr = Tensor(np.full(args.steps, 0.05, np.float32))
damping = Tensor(np.full(args.steps, 0.03, np.float32))
opt = nn.thor(net, lr, damping, 0.9, 1e-4, 128, 8, frequency=args.frequency)
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
manager = ms.FixedLossScaleManager(128, drop_overflow_update=False)
model = ms.Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=manager, metrics={"acc"}, amp_level="O2",
                 keep_batchnorm_fp32=False)
model = ms.ConvertModelUtils.convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                   loss_scale_manager=manager, metrics={"acc"}, amp_level="O2",
                                                   keep_batchnorm_fp32=False)
data = make_dataset(8, args.steps)
model.train(1, data, callbacks=[LossMonitor()], sink_size=args.steps, dataset_sink_mode=True)
after = {p.name: p.asnumpy() for p in net.trainable_params()}
changed = all(not np.array_equal(after[k], before[k]) for k in before)
finite = all(np.all(np.isfinite(v)) for v in after.values())
print(f"script: name={__name__} argv={sys.argv[1:]} optimizer={type(opt).__module__}.{type(opt).__name__} "
      f"model={type(model).__module__}.{type(model).__name__}")
print(f"script: changed={changed} finite={finite} acc={model.eval(data)['acc']:.3f}")
sys.exit(args.exit_code)
