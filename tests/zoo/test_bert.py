"""model_zoo/bert: the tiny config pretrains a few masked-LM steps with Lamb and with THOR.

The test writes its own text, learns a WordPiece vocabulary from it (HuggingFace ``tokenizers``), runs
``model_zoo/bert/train.py``'s ``main`` (data-sink training, checkpoints) and checks that the losses
are finite, that every weight moved away from its initial value, and that the final checkpoint
holds exactly the network's parameters. With THOR the embeddings and dense layers must have become
ms_optim's THOR layers.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

import mindspore as ms

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BERT_DIR = os.path.join(REPO, "model_zoo", "bert")

pytest.importorskip("tokenizers", reason="the BERT example needs HuggingFace tokenizers (examples extra)")


def _load(name):
    """Import a model_zoo/bert module under a private name (other zoo folders have a train.py too)."""
    if BERT_DIR not in sys.path:
        sys.path.insert(0, BERT_DIR)
    if name != "train":  # bert_model/bert_data: unique names, shared with train.py's own imports
        return importlib.import_module(name)
    key = "_bert_zoo_train"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(BERT_DIR, "train.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


WORDS = ("the a cat dog bird runs jumps flies over under near quickly slowly red blue green house tree "
         "river mountain sings reads writes book letter friend teacher student city village morning "
         "evening bright dark small large").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_text")
    rng = np.random.default_rng(0)
    paths = []
    for part in range(2):
        path = folder / f"part{part}.txt"
        lines = [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 14)))) + "." for _ in range(120)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(str(path))
    bert_data = _load("bert_data")
    vocab = bert_data.train_vocab(paths, str(folder / "vocab"), vocab_size=120, min_frequency=1)
    return paths, vocab


def test_wordpiece_data_pipeline(corpus):
    paths, vocab = corpus
    bert_data = _load("bert_data")
    tokenizer = bert_data.load_tokenizer(vocab)
    assert tokenizer.get_vocab_size() <= 120
    rows = bert_data.tokenize_corpus(paths, tokenizer, seq_length=32)
    cls_id, sep_id, mask_id, pad_id = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
    assert rows.shape[1] == 32 and np.all(rows[:, 0] == cls_id) and np.all((rows == sep_id).sum(axis=1) == 1)
    source = bert_data.MaskedLMSource(rows, tokenizer.get_vocab_size(),
                                      [tokenizer.token_to_id(t) for t in bert_data.SPECIAL_TOKENS], mask_id,
                                      pad_id, max_predictions=5, seed=0)
    ids, input_mask, types, positions, labels, weights = source[0]
    real = int(weights.sum())
    assert 1 <= real <= 5 and np.all(weights[real:] == 0)
    assert np.array_equal(rows[0][positions[:real]], labels[:real])  # labels are the original tokens
    unmasked = np.setdiff1d(np.arange(32), positions[:real])
    assert np.array_equal(ids[unmasked], rows[0][unmasked])  # only chosen positions may change
    assert np.array_equal(input_mask, (rows[0] != pad_id).astype(np.int32)) and not types.any()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["lamb", "thor"])
def test_tiny_bert_pretrains_with_each_optimizer(corpus, tmp_path, optimizer, capsys):
    paths, vocab = corpus
    train = _load("train")
    bert_model = _load("bert_model")
    out = tmp_path / optimizer
    argv = ["--data", *paths, "--vocab", vocab, "--config", "tiny", "--seq-length", "32", "--batch-size", "8",
            "--max-predictions", "5", "--epochs", "2", "--steps-per-epoch", "2", "--optimizer", optimizer,
            "--dropout", "0.0", "--frequency", "2", "--save-steps", "2", "--output-dir", str(out), "--seed", "5"]
    result = train.main(argv)
    printed = capsys.readouterr().out
    assert result["steps"] == 4 and len(result["losses"]) >= 2
    assert all(np.isfinite(result["losses"]))
    assert "step 4/4 loss" in printed, printed

    tokenizer = _load("bert_data").load_tokenizer(vocab)
    config = bert_model.get_config("tiny", tokenizer.get_vocab_size(), hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)
    ms.set_seed(5)  # train.main builds its network right after the same seed: the same initial values
    fresh = bert_model.BertPretrainingLoss(bert_model.BertForMaskedLM(config))
    initial = {p.name: p.asnumpy() for p in fresh.trainable_params()}
    trained = ms.load_checkpoint(result["checkpoint"])
    assert set(initial) <= set(trained)
    for name, value in initial.items():
        got = trained[name].asnumpy()
        assert np.all(np.isfinite(got)), name
        if name.endswith("weight") or name.endswith("embedding_table"):
            assert not np.array_equal(got, value), f"{name} did not train"
    assert any(f.startswith(f"bert_tiny_{optimizer}-") and f.endswith(".ckpt") for f in os.listdir(out))

    import ms_optim

    mlm = result["network"].network
    layers = [mlm.bert.embeddings.word_embeddings, mlm.bert.layers[0].attention.query, mlm.decoder]
    converted = [isinstance(cell, (ms_optim.EmbeddingThor, ms_optim.DenseThor)) for cell in layers]
    assert converted == [optimizer == "thor"] * 3


def test_train_help_and_configs(capsys):
    train = _load("train")
    with pytest.raises(SystemExit) as exc:
        train.parse_args(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--data", "--vocab", "--config", "--optimizer", "--frequency", "--no-sink", "--output-dir"):
        assert option in text
    bert_model = _load("bert_model")
    base, large = bert_model.get_config("base", 30522), bert_model.get_config("large", 30522)
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads) == (768, 12, 12)
    assert (large.hidden_size, large.num_hidden_layers, large.num_attention_heads) == (1024, 24, 16)
    with pytest.raises(ValueError, match="num_attention_heads"):
        bert_model.get_config("tiny", 100, num_attention_heads=3)
