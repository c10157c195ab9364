"""Tiny datasets in the real on-disk formats, generated for the model-zoo tests.

* CIFAR-10 binary: ``model_zoo.resnet.src.synthetic.write_cifar10`` (re-exported here; one file of each
  kind is enough).
* ImageFolder: ``root/<class>/<index>.png`` (PNG encoded with Pillow, which MindSpore depends on).

Images carry a class-dependent colour so a few steps can learn something.
"""
from __future__ import annotations

import os

import numpy as np

from model_zoo.resnet.src.synthetic import class_images as _images
from model_zoo.resnet.src.synthetic import write_cifar10  # noqa: F401 - the zoo tests import it from here
from support import REPO

# Where the ResNet zoo and the launchers live (shared by the zoo tests).
ZOO = os.path.join(REPO, "model_zoo", "resnet")
TRAIN = os.path.join(ZOO, "train.py")
EVAL = os.path.join(ZOO, "eval.py")
CONFIGS = os.path.join(ZOO, "configs")
SCRIPTS = os.path.join(REPO, "scripts")


def write_image_folder(root: str, per_class: int = 8, classes: int = 5, size: int = 40, seed: int = 0) -> str:
    """Write ``classes`` folders of ``per_class`` PNG images each; returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        images = _images(rng, np.full(per_class, c), size, classes)
        for i, img in enumerate(images):
            Image.fromarray(img).save(os.path.join(folder, f"img_{i:04d}.png"))
    return root


def write_rank_table(path: str, device_num: int = 8, server_ip: str = "10.0.0.1") -> str:
    """A rank table (version 1.0, the Ascend hccl_tools format) for ``device_num`` devices."""
    import json

    devices = [{"device_id": str(i), "device_ip": f"192.168.100.{101 + i}", "rank_id": str(i)}
               for i in range(device_num)]
    table = {"version": "1.0", "server_count": "1", "status": "completed",
             "server_list": [{"server_id": server_ip, "device": devices, "host_nic_ip": "reserve"}]}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=2)
    return path
