"""Input pipelines: ImageNet as an ImageFolder tree and CIFAR-10 in its binary format.

``check_data_path`` inspects the layout with plain ``os`` calls (no MindSpore import), so a wrong
path or layout is reported in one line before anything is built. ``create_dataset`` builds the
``mindspore.dataset`` pipeline, sharded by rank:

* train: random crop (ImageNet: random-resized crop, scale 0.08-1; CIFAR-10: 4-pixel padded crop),
  random horizontal flip, per-channel normalisation, HWC->CHW, drop of the last partial batch;
* eval: ImageNet resize to image_size/0.875 and center crop; CIFAR-10 as stored; normalisation.

Determinism: the data of epoch ``e`` depends only on (seed, e) - the shuffle and the augmentation
random state are seeded with ``seed * 1000003 + e`` - so a run resumed at any step sees exactly the
batches the uninterrupted run saw.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .config import ConfigError

__all__ = ["check_data_path", "create_dataset", "IMAGE_EXTENSIONS", "CIFAR_RECORD_BYTES",
           "CIFAR_RECORDS_PER_FILE"]

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp")
CIFAR_RECORD_BYTES = 1 + 32 * 32 * 3
CIFAR_RECORDS_PER_FILE = 10000  # MindSpore's reader reads exactly this many records from every file
_IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
_IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
_CIFAR_MEAN = [0.4914 * 255, 0.4822 * 255, 0.4465 * 255]
_CIFAR_STD = [0.2470 * 255, 0.2435 * 255, 0.2616 * 255]


def _cifar_files(path: str, training: bool) -> List[str]:
    names = sorted(os.listdir(path))
    if training:
        return [n for n in names if n.startswith("data_batch_") and n.endswith(".bin")]
    return [n for n in names if n == "test_batch.bin"]


def check_data_path(path: str, dataset: str, training: bool) -> Tuple[str, int]:
    """Validate the on-disk layout; returns (directory to read, number of images). Raises ConfigError."""
    if not path:
        raise ConfigError("--data_path is required")
    if not os.path.exists(path):
        raise ConfigError(f"data_path does not exist: {path}")
    if not os.path.isdir(path):
        raise ConfigError(f"data_path is not a directory: {path}")
    if dataset == "cifar10":
        nested = os.path.join(path, "cifar-10-batches-bin")
        if os.path.isdir(nested) and not _cifar_files(path, training):
            path = nested
        files = _cifar_files(path, training)
        if not files:
            wanted = "data_batch_1.bin ... data_batch_5.bin" if training else "test_batch.bin"
            raise ConfigError(f"data_path {path} is not a CIFAR-10 binary folder: no {wanted} in it")
        total = 0
        for name in files:
            size = os.path.getsize(os.path.join(path, name))
            if size != CIFAR_RECORDS_PER_FILE * CIFAR_RECORD_BYTES:
                raise ConfigError(f"CIFAR-10 file {os.path.join(path, name)} has {size} bytes, expected "
                                  f"{CIFAR_RECORDS_PER_FILE} records x {CIFAR_RECORD_BYTES} bytes "
                                  f"(one label byte + 32x32x3)")
            total += CIFAR_RECORDS_PER_FILE
        return path, total
    classes = sorted(e.name for e in os.scandir(path) if e.is_dir())
    if not classes:
        raise ConfigError(f"data_path {path} is not an ImageFolder tree: no class sub-folders "
                          f"(expected DATA_PATH/<class>/<image>.JPEG)")
    total = 0
    for name in classes:
        total += sum(1 for e in os.scandir(os.path.join(path, name))
                     if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))
    if total == 0:
        raise ConfigError(f"data_path {path} has {len(classes)} class folders but no images "
                          f"({', '.join(IMAGE_EXTENSIONS)})")
    return path, total


def create_dataset(path: str, dataset: str, training: bool, batch_size: int, image_size: int,
                   seed: int = 1, epoch: int = 0, rank_size: int = 1, rank_id: int = 0,
                   num_parallel_workers: int = 4, steps: Optional[int] = None, skip_steps: int = 0):
    """The batched pipeline of one epoch (training) or of the eval set.

    ``steps`` caps the number of batches (None = all); ``skip_steps`` drops the first batches of the
    epoch after producing them, so the augmentation random state matches an uninterrupted run.
    """
    import mindspore as ms
    import mindspore.dataset as ds
    import mindspore.dataset.transforms as T
    import mindspore.dataset.vision as V

    ds.config.set_seed(seed * 1000003 + epoch)
    shard = {"num_shards": rank_size, "shard_id": rank_id} if rank_size > 1 else {}
    workers = max(1, min(num_parallel_workers, os.cpu_count() or 1))
    if dataset == "cifar10":
        data = ds.Cifar10Dataset(path, usage="train" if training else "test", shuffle=training,
                                 num_parallel_workers=workers, **shard)
        ops = []
        if training:
            ops += [V.RandomCrop((32, 32), padding=(4, 4, 4, 4)), V.RandomHorizontalFlip(prob=0.5)]
        if image_size != 32:
            ops.append(V.Resize((image_size, image_size)))
        ops += [V.Normalize(mean=_CIFAR_MEAN, std=_CIFAR_STD), V.HWC2CHW()]
    else:
        data = ds.ImageFolderDataset(path, shuffle=training, num_parallel_workers=workers,
                                     extensions=[e for ext in IMAGE_EXTENSIONS for e in (ext, ext.upper())],
                                     **shard)
        if training:
            ops = [V.RandomCropDecodeResize(image_size, scale=(0.08, 1.0), ratio=(0.75, 1.333)),
                   V.RandomHorizontalFlip(prob=0.5)]
        else:
            ops = [V.Decode(), V.Resize(int(round(image_size / 0.875))), V.CenterCrop(image_size)]
        ops += [V.Normalize(mean=_IMAGENET_MEAN, std=_IMAGENET_STD), V.HWC2CHW()]
    data = data.map(operations=ops, input_columns="image", num_parallel_workers=workers)
    data = data.map(operations=T.TypeCast(ms.int32), input_columns="label", num_parallel_workers=workers)
    data = data.batch(batch_size, drop_remainder=training)
    if steps is not None:
        data = data.take(steps)
    if skip_steps:
        data = data.skip(skip_steps)
    return data
