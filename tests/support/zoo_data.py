"""Tiny datasets in the real on-disk formats, generated for the model-zoo tests.

* CIFAR-10 binary: files of 10000 records of 3073 bytes (1 label byte, then 32x32 R, G, B planes),
  ``data_batch_{1..n}.bin`` for training and ``test_batch.bin`` for eval (MindSpore's reader needs
  exactly 10000 records per file; one file of each kind is enough).
* ImageFolder: ``root/<class>/<index>.png`` (PNG encoded with Pillow, which MindSpore depends on).

Images carry a class-dependent colour so a few steps can learn something.
"""
from __future__ import annotations

import os

import numpy as np

from support import REPO

# Where the ResNet zoo and the launchers live (shared by the zoo tests).
ZOO = os.path.join(REPO, "model_zoo", "resnet")
TRAIN = os.path.join(ZOO, "train.py")
EVAL = os.path.join(ZOO, "eval.py")
CONFIGS = os.path.join(ZOO, "configs")
SCRIPTS = os.path.join(REPO, "scripts")


def _images(rng: np.random.Generator, labels: np.ndarray, size: int, classes: int) -> np.ndarray:
    base = rng.integers(40, 216, size=(classes, 3), dtype=np.int16)
    noise = rng.integers(-40, 41, size=(len(labels), size, size, 3), dtype=np.int16)
    return (base[labels][:, None, None, :] + noise).astype(np.uint8)  # N,H,W,C


def write_cifar10(root: str, train_per_file: int = 10000, files: int = 1, test: int = 10000,
                  classes: int = 10, seed: int = 0) -> str:
    """Write ``files`` training batch files and one test file; returns ``root``."""
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)

    def write(name: str, count: int) -> None:
        labels = rng.integers(0, classes, size=count)
        images = _images(rng, labels, 32, classes).transpose(0, 3, 1, 2).reshape(count, -1)  # CHW planes
        records = np.concatenate([labels.astype(np.uint8)[:, None], images], axis=1)
        records.astype(np.uint8).tofile(os.path.join(root, name))

    for i in range(1, files + 1):
        write(f"data_batch_{i}.bin", train_per_file)
    if test:
        write("test_batch.bin", test)
    return root


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
