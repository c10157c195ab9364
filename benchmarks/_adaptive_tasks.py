"""The three tasks of ``bench_thor_adaptive.py`` (LeNet on digits, ResNet-18 on CIFAR-10-format data, tiny
BERT) and the model zoo's THOR recipe of each, built from the zoo's own nets, data code and schedules.

``build_task(name, args)`` returns a dict: ``name``, ``batch`` (batch size), ``batches`` (tuples of NumPy
arrays, the training inputs of every step, fixed once so every run sees the same), ``build()`` -> ``(net,
net_with_loss)``, ``evaluate(net)`` -> the held-out figure in [0, 1], ``baselines`` (first-order optimizers
run over the lr grid), ``steps_per_epoch``.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict

# the run order: the slowest task last
TASKS = {"lenet": "accuracy", "bert": "masked-token accuracy", "resnet": "accuracy"}
TARGETS = {"lenet": 0.90, "resnet": 0.90, "bert": 0.50}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET_RECIPE = os.path.join(ROOT, "model_zoo", "resnet", "configs", "resnet18_cifar10_thor.yaml")


def _classifier(make_net, batches, x_test, y_test, name: str) -> Dict:
    import numpy as np
    from mindspore import Tensor
    from mindspore import nn as mnn

    def build():
        net = make_net()
        return net, mnn.WithLossCell(net, mnn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))

    def evaluate(net) -> float:
        net.set_train(False)
        return float(np.mean(np.argmax(net(Tensor(x_test)).asnumpy(), axis=1) == y_test))

    return {"name": name, "batch": len(batches[0][1]), "batches": batches, "build": build,
            "evaluate": evaluate, "baselines": ("momentum",)}


def lenet(args) -> Dict:
    """The quickstart's LeNet5 on digits (bench_thor_robust's loader: 44 batches of 32 per epoch)."""
    from benchmarks.bench_thor_robust import lenet_task

    make_net, batches, x_test, y_test = lenet_task(args.seed, args.lenet_epochs)
    if args.quick:
        batches = batches[:6]
    return {**_classifier(make_net, batches, x_test, y_test, "lenet"), "steps_per_epoch": 44}


def resnet(args) -> Dict:
    """ResNet-18 (CIFAR stem) on the zoo's generated CIFAR-10 files, read by the zoo's CIFAR-10 pipeline."""
    import numpy as np

    from model_zoo.resnet.src.dataset import CIFAR_RECORDS_PER_FILE, create_dataset
    from model_zoo.resnet.src.resnet import build_resnet
    from model_zoo.resnet.src.synthetic import write_cifar10

    per_epoch = args.resnet_images // 32
    with tempfile.TemporaryDirectory() as folder:
        write_cifar10(folder, CIFAR_RECORDS_PER_FILE, files=1, test=CIFAR_RECORDS_PER_FILE, seed=args.seed)
        batches = []
        for epoch in range(args.resnet_epochs):  # resnet_images shuffled, augmented images per epoch
            data = create_dataset(folder, "cifar10", True, 32, 32, seed=args.seed, epoch=epoch,
                                  steps=per_epoch)
            batches += [(x.astype(np.float32), y.astype(np.int32))
                        for x, y in data.create_tuple_iterator(output_numpy=True)]
        test = create_dataset(folder, "cifar10", False, 320, 32, steps=1)
        x_test, y_test = next(test.create_tuple_iterator(output_numpy=True))
    if args.quick:
        batches = batches[:4]

    def make_net():
        return build_resnet("resnet18", class_num=10, width=args.resnet_width, stem="cifar")

    return {**_classifier(make_net, batches, x_test.astype(np.float32), y_test, "resnet"),
            "steps_per_epoch": per_epoch}


WORDS = {"adj": "red blue green small large old young bright dark quiet".split(),
         "noun": "cat dog bird fish horse teacher student farmer child river".split(),
         "verb": "sleeps barks sings swims runs reads writes works plays flows".split(),
         "prep": "near under over behind beside".split()}


def _corpus(path: str, sentences: int, seed: int) -> str:
    """Sentences 'the ADJ NOUN VERB PREP the ADJ NOUN .', each noun with its own verb (learnable by MLM)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(sentences):
        a, b = rng.integers(0, 10, 2)
        lines.append(f"the {rng.choice(WORDS['adj'])} {WORDS['noun'][a]} {WORDS['verb'][a]} "
                     f"{rng.choice(WORDS['prep'])} the {rng.choice(WORDS['adj'])} {WORDS['noun'][b]} .")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def _word_vocab(path: str, bert_data) -> str:
    """A ``vocab.txt`` of the special tokens and every word of the corpus (sorted): one token per word and the
    same ids in every process, so every run of a grid trains the same problem (the ids fix which embedding row
    each word gets)."""
    words = sorted({word for group in WORDS.values() for word in group} | {"the", "."})
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(bert_data.SPECIAL_TOKENS + words) + "\n")
    return path


def bert(args) -> Dict:
    """The zoo's tiny BERT, masked-LM on the generated corpus (seq 32, batch 16, masked afresh per epoch)."""
    import numpy as np
    from mindspore import Tensor

    from model_zoo.bert import bert_data
    from model_zoo.bert.bert_model import BertForMaskedLM, BertPretrainingLoss, get_config

    seq, batch = 32, 16
    with tempfile.TemporaryDirectory() as folder:
        train = _corpus(os.path.join(folder, "train.txt"), 480, args.seed)
        held = _corpus(os.path.join(folder, "test.txt"), 480, args.seed + 100)
        tokenizer = bert_data.load_tokenizer(_word_vocab(os.path.join(folder, "vocab.txt"), bert_data))
        rows = bert_data.tokenize_corpus([train], tokenizer, seq)
        test_rows = bert_data.tokenize_corpus([held], tokenizer, seq)
    vocab = tokenizer.get_vocab_size()
    ids = {t: tokenizer.token_to_id(t) for t in bert_data.SPECIAL_TOKENS}
    special = [ids[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]

    def source(rows_, seed):
        return bert_data.MaskedLMSource(rows_, vocab, special, ids["[MASK]"], ids["[PAD]"], 5, seed=seed)

    def stack(src, order):
        items = [src[i] for i in order]
        return tuple(np.stack([item[c] for item in items]) for c in range(6))

    rng, train_source = np.random.default_rng(args.seed), source(rows, args.seed)
    per_epoch = len(rows) // batch
    batches = []
    for _ in range(args.bert_epochs):
        order = rng.permutation(len(rows))
        batches += [stack(train_source, order[i * batch:(i + 1) * batch]) for i in range(per_epoch)]
    if args.quick:
        batches = batches[:4]
    test = stack(source(test_rows, args.seed + 100), range(len(test_rows)))
    config = get_config("tiny", vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def build():
        net = BertForMaskedLM(config)
        return net, BertPretrainingLoss(net)

    def evaluate(net) -> float:
        net.set_train(False)
        logits = net(*[Tensor(x) for x in test[:4]]).asnumpy()
        weights = test[5].reshape(-1)
        return float(np.sum((np.argmax(logits, axis=1) == test[4].reshape(-1)) * weights) / weights.sum())

    return {"name": "bert", "batch": batch, "batches": batches, "build": build, "evaluate": evaluate,
            "baselines": ("momentum", "lamb"), "steps_per_epoch": per_epoch}


def build_task(name: str, args) -> Dict:
    return {"lenet": lenet, "resnet": resnet, "bert": bert}[name](args)


def recipe_optimizer(task: Dict, net_with_loss, frequency: int):
    """THOR with the model zoo's recipe for the task's model (see the benchmark): (opt, loss scale)."""
    import numpy as np
    from mindspore import Tensor

    from ms_optim import nn as ms_nn

    total = len(task["batches"])
    if task["name"] == "lenet":
        from model_zoo.lenet.train import make_optimizer, tuned_lr

        return make_optimizer("thor", net_with_loss, tuned_lr()["thor"], total, task["batch"]), 1.0
    if task["name"] == "resnet":
        from model_zoo.resnet.src.config import load_config
        from model_zoo.resnet.src.lr_schedule import thor_schedules

        config = load_config(RESNET_RECIPE)
        lr, damping = thor_schedules(config, task["steps_per_epoch"])
        return ms_nn.thor(net_with_loss, Tensor(lr[:total]), Tensor(damping[:total]), config["momentum"],
                          config["weight_decay"], config["loss_scale"], task["batch"],
                          split_indices=config["split_indices"], frequency=frequency,
                          factor_convention=config["factor_convention"]), config["loss_scale"]
    from model_zoo.bert import train as bert_train

    defaults = bert_train.parse_args(["--data", "-", "--optimizer", "thor"])
    lr = bert_train.lr_schedule(defaults.lr, total, defaults.warmup_steps)
    damping = bert_train.damping_schedule(defaults.damping, defaults.damping_decay, total)
    return ms_nn.thor(net_with_loss, Tensor(lr), Tensor(damping), defaults.momentum, defaults.weight_decay,
                      defaults.loss_scale, task["batch"], decay_filter=lambda p: not bert_train._no_decay(p),
                      frequency=frequency), np.float32(defaults.loss_scale).item()
