"""scikit-learn's handwritten digits as 1x32x32 images, split 80/20 with a fixed seed.

The 8x8 images (grey levels 0..16) are upscaled 4x by pixel repetition to 32x32 (the input size of
LeNet5), scaled to [0, 1] and standardised with the training set's mean and standard deviation.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def load_digits_32(seed: int = 0, test_fraction: float = 0.2) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(x_train, y_train, x_test, y_test)``: float32 (N, 1, 32, 32) images, int32 labels.

    The split is stratified by class and depends only on ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0                  # (N, 8, 8) in [0, 1]
    images = np.repeat(np.repeat(images, 4, axis=1), 4, axis=2)        # (N, 32, 32)
    images = images[:, None, :, :]
    labels = digits.target.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(images, labels, test_size=test_fraction,
                                              random_state=seed, stratify=labels)
    mean, std = float(x_tr.mean()), float(x_tr.std())
    x_tr = ((x_tr - mean) / std).astype(np.float32)
    x_te = ((x_te - mean) / std).astype(np.float32)
    return x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32)


def create_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int = 32, shuffle: bool = True,
                   seed: int = 0, drop_remainder: bool = True):
    """A MindSpore dataset of ``(image, label)`` batches; shuffled once per epoch when ``shuffle``.

    Shuffling uses a NumPy generator seeded with ``seed`` (a new permutation every epoch), so two
    datasets built with the same arguments yield the same batches in the same order.
    """
    import mindspore.dataset as ds

    class _Source:
        def __init__(self):
            self.epoch = 0

        def __len__(self):
            return len(labels)

        def __iter__(self):
            order = np.arange(len(labels))
            if shuffle:
                order = np.random.default_rng([seed, self.epoch]).permutation(len(labels))
            self.epoch += 1
            for i in order:
                yield images[i], labels[i:i + 1].reshape(())

    source = _Source()
    data = ds.GeneratorDataset(source, column_names=["image", "label"], shuffle=False)
    return data.batch(batch_size, drop_remainder=drop_remainder)
