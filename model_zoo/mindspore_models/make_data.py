"""Tiny data sets and CPU configs for running MindSpore's own model-zoo scripts with ms_optim.

The scripts are those of the repository mindspore-ai/models (not part of ms_optim): this tool writes,
for a checkout of it, small data in each script's own on-disk format and a small config next to the
data, so that ``python -m ms_optim.run SCRIPT --flags ...`` trains a few steps on CPU. Nothing of the
models repository is copied: the configs are the repository's own yaml files loaded from the
checkout, with the keys listed below overridden.

* ``bert``: MindRecord pretraining records (``input_ids``, ``input_mask``, ``segment_ids``,
  ``next_sentence_labels``, ``masked_lm_positions``, ``masked_lm_ids``, ``masked_lm_weights``) and
  ``bert_cpu.yaml`` from ``official/nlp/Bert/pretrain_config.yaml`` (a 2-layer, 32-wide BERT in
  float32, batch 4, CPU allowed as device target).
* ``gnmt``: MindRecord translation records (``src``, ``src_padding``, ``prev_opt``, ``target``,
  ``tgt_padding``) and ``gnmt_cpu.yaml`` from ``research/nlp/gnmt_v2/default_config.yaml`` (hidden
  size 32, vocabulary 64, sequence length 8, batch 2, no dataset sink).
* ``imagefolder``: an ImageFolder tree of JPEG images (``root/<class>/<n>.jpg``) as res2net's and
  ResNet's ImageNet readers expect (``--classes``, ``--images-per-class``, ``--image-size``).

Usage::

    python model_zoo/mindspore_models/make_data.py --models /path/to/models --out /tmp/zoo-data
    python model_zoo/mindspore_models/make_data.py --models /path/to/models --out /tmp/zoo-data \
        --only imagefolder --classes 4 --images-per-class 32 --image-size 32
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

BERT_YAML = "official/nlp/Bert/pretrain_config.yaml"
GNMT_YAML = "research/nlp/gnmt_v2/default_config.yaml"


def _write_mindrecord(path: str, schema: Dict[str, dict], rows: List[dict]) -> None:
    from mindspore.mindrecord import FileWriter

    for stale in (path, path + ".db"):
        if os.path.exists(stale):
            os.remove(stale)
    writer = FileWriter(file_name=path, shard_num=1, overwrite=True)
    writer.add_schema(schema, "ms_optim zoo data")
    writer.write_raw_data(rows)
    writer.commit()


def _load_docs(path: str) -> List[dict]:
    with open(path, encoding="utf-8") as f:
        return list(yaml.safe_load_all(f))


def _dump_docs(path: str, docs: List[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)


def write_bert(models: str, out: str, records: int = 32, seq: int = 16, vocab: int = 64,
               max_pred: int = 4, seed: int = 0) -> str:
    """BERT pretraining MindRecord in ``out/bert/data`` and ``out/bert/bert_cpu.yaml``; returns the yaml."""
    rng = np.random.default_rng(seed)
    data_dir = os.path.join(out, "bert", "data")
    os.makedirs(data_dir, exist_ok=True)
    rows = []
    for _ in range(records):
        length = int(rng.integers(seq // 2, seq + 1))
        ids = np.zeros(seq, np.int64)
        ids[:length] = rng.integers(5, vocab, size=length)
        mask = (np.arange(seq) < length).astype(np.int64)
        segment = (np.arange(seq) >= length // 2).astype(np.int64) * mask
        positions = np.sort(rng.choice(np.arange(1, length), size=max_pred, replace=False)).astype(np.int64)
        rows.append({"input_ids": ids, "input_mask": mask, "segment_ids": segment,
                     "next_sentence_labels": np.array([rng.integers(0, 2)], np.int64),
                     "masked_lm_positions": positions, "masked_lm_ids": ids[positions].copy(),
                     "masked_lm_weights": np.ones(max_pred, np.float32)})
    schema = {name: {"type": "int64", "shape": [-1]} for name in rows[0]}
    schema["masked_lm_weights"] = {"type": "float32", "shape": [-1]}
    _write_mindrecord(os.path.join(data_dir, "bert.mindrecord"), schema, rows)

    docs = _load_docs(os.path.join(models, BERT_YAML))
    cfg = docs[0]
    cfg.update(device_target="CPU", enable_save_ckpt="false", base_batch_size=4, data_sink_steps=1,
               data_dir=data_dir, save_checkpoint_path=os.path.join(out, "bert", "ckpt"))
    cfg["base_net_cfg"].update(seq_length=seq, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, max_position_embeddings=seq,
                               compute_type="mstype.float32")
    cfg["Lamb"].update(warmup_steps=2, learning_rate=0.01)
    cfg["Thor"].update(lr_max=0.01, lr_total_steps=100, damping_total_steps=100, frequency=2)
    if len(docs) > 2:
        docs[2]["device_target"] = ["Ascend", "GPU", "CPU"]
    path = os.path.join(out, "bert", "bert_cpu.yaml")
    _dump_docs(path, docs)
    return path


def write_gnmt(models: str, out: str, records: int = 400, seq: int = 8, vocab: int = 64, seed: int = 0) -> str:
    """GNMT MindRecord in ``out/gnmt/data`` and ``out/gnmt/gnmt_cpu.yaml``; returns the yaml."""
    rng = np.random.default_rng(seed)
    data_dir = os.path.join(out, "gnmt", "data")
    os.makedirs(data_dir, exist_ok=True)
    rows = []
    for _ in range(records):
        src_len, tgt_len = (int(v) for v in rng.integers(3, seq, size=2))
        src = np.zeros(seq, np.int64)
        src[:src_len] = rng.integers(4, vocab, size=src_len)
        src[src_len] = 3  # EOS
        target = np.zeros(seq, np.int64)
        target[:tgt_len] = (src[:tgt_len] + 1) % vocab  # a learnable mapping
        target[tgt_len] = 3
        prev = np.concatenate([[2], target[:-1]])  # SOS then the target shifted right
        rows.append({"src": src, "src_padding": (src > 0).astype(np.int64), "prev_opt": prev,
                     "target": target, "tgt_padding": (target > 0).astype(np.int64)})
    schema = {name: {"type": "int64", "shape": [-1]} for name in rows[0]}
    path_data = os.path.join(data_dir, "gnmt.mindrecord")
    _write_mindrecord(path_data, schema, rows)

    docs = _load_docs(os.path.join(models, GNMT_YAML))
    docs[0].update(device_target="CPU", epochs=1, batch_size=2, pre_train_dataset=path_data,
                   dataset_sink_mode=False, seq_length=seq, vocab_size=vocab, hidden_size=32,
                   num_hidden_layers=4, intermediate_size=64, max_decode_length=seq, warmup_steps=10,
                   save_ckpt_steps=100000, ckpt_path=os.path.join(out, "gnmt", "ckpt"))
    path = os.path.join(out, "gnmt", "gnmt_cpu.yaml")
    _dump_docs(path, docs)
    return path


def write_imagefolder(out: str, classes: int = 4, per_class: int = 4, size: int = 40, seed: int = 0) -> str:
    """ImageFolder tree of JPEGs with a class-dependent colour in ``out/imagefolder``; returns its path."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = os.path.join(out, "imagefolder")
    for c in range(classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        colour = rng.integers(40, 216, size=3)
        for i in range(per_class):
            noise = rng.integers(-40, 41, size=(size, size, 3))
            img = np.clip(colour + noise, 0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(folder, f"{i:04d}.jpg"))
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="checkout of mindspore-ai/models (its yaml files are read)")
    parser.add_argument("--out", required=True, help="output folder (bert/, gnmt/, imagefolder/ are written)")
    parser.add_argument("--only", choices=["bert", "gnmt", "imagefolder"], action="append",
                        help="write only these (repeatable; default: all)")
    parser.add_argument("--classes", type=int, default=4, help="imagefolder: class folders (default 4)")
    parser.add_argument("--images-per-class", type=int, default=4, help="imagefolder: images per class (default 4)")
    parser.add_argument("--image-size", type=int, default=40, help="imagefolder: image side in pixels (default 40)")
    args = parser.parse_args(argv)
    if min(args.classes, args.images_per_class, args.image_size) < 1:
        parser.error("--classes, --images-per-class and --image-size must be >= 1")
    only = args.only or ["bert", "gnmt", "imagefolder"]
    if "bert" in only:
        print("bert config:", write_bert(args.models, args.out))
    if "gnmt" in only:
        print("gnmt config:", write_gnmt(args.models, args.out))
    if "imagefolder" in only:
        print("image folder:", write_imagefolder(args.out, args.classes, args.images_per_class, args.image_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
