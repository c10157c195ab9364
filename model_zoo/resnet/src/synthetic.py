"""Generated CIFAR-10 data in its real binary format, for tests, smoke runs and benchmarks (no download).

Each image is a colour fixed per class plus uniform noise, so a few steps can learn something:
``class_images`` makes them (uint8, N x H x W x C), ``write_cifar10`` writes ``data_batch_{1..n}.bin`` and
``test_batch.bin`` (records of 3073 bytes: 1 label byte, then the 32x32 R, G, B planes) that
``dataset.create_dataset(path, "cifar10", ...)`` reads. MindSpore's reader reads exactly 10000 records
from every file (``dataset.CIFAR_RECORDS_PER_FILE``), so that is the default file size.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

__all__ = ["class_colours", "class_images", "write_cifar10"]


def class_colours(rng: np.random.Generator, classes: int) -> np.ndarray:
    """One colour per class (int16, classes x 3, each channel in [40, 216))."""
    return rng.integers(40, 216, size=(classes, 3), dtype=np.int16)


def class_images(rng: np.random.Generator, labels: np.ndarray, size: int, classes: int,
                 colours: Optional[np.ndarray] = None) -> np.ndarray:
    """uint8 images (N, size, size, 3): the class's colour (``colours``, else drawn from ``rng``) plus noise in
    [-40, 40]."""
    base = class_colours(rng, classes) if colours is None else colours
    noise = rng.integers(-40, 41, size=(len(labels), size, size, 3), dtype=np.int16)
    return (base[labels][:, None, None, :] + noise).astype(np.uint8)  # N,H,W,C


def write_cifar10(root: str, train_per_file: int = 10000, files: int = 1, test: int = 10000,
                  classes: int = 10, seed: int = 0) -> str:
    """Write ``files`` training batch files and one test file (none if ``test`` is 0), all with the same
    class colours; returns ``root``."""
    rng = np.random.default_rng(seed)
    colours = class_colours(rng, classes)  # the same classes in every file, the test file too
    os.makedirs(root, exist_ok=True)

    def write(name: str, count: int) -> None:
        labels = rng.integers(0, classes, size=count)
        images = class_images(rng, labels, 32, classes, colours).transpose(0, 3, 1, 2).reshape(count, -1)  # CHW planes
        records = np.concatenate([labels.astype(np.uint8)[:, None], images], axis=1)
        records.astype(np.uint8).tofile(os.path.join(root, name))

    for i in range(1, files + 1):
        write(f"data_batch_{i}.bin", train_per_file)
    if test:
        write("test_batch.bin", test)
    return root
