"""model_zoo/bert: the tiny config pretrains a few masked-LM steps with Lamb and with THOR.

The test writes its own text, learns a WordPiece vocabulary from it (``bert_data.learn_vocab``), runs
``model_zoo/bert/train.py``'s ``main`` (data-sink training, checkpoints) and checks that the losses
are finite, that every weight moved away from its initial value, and that the final checkpoint
holds exactly the network's parameters. With THOR the embeddings and dense layers must have become
ms_optim's THOR layers.
"""
import importlib
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BERT_TRAIN = os.path.join(REPO, "model_zoo", "bert", "train.py")

pytest.importorskip("tokenizers", reason="the BERT example needs HuggingFace tokenizers (examples extra)")


def _load(name):
    """A model_zoo/bert module, by its one name ``model_zoo.bert.NAME`` (see model_zoo/README.md)."""
    return importlib.import_module(f"model_zoo.bert.{name}")


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


#: "low" x5, "lower" x2, "newest" x6, "widest" x3 and the vocabulary learned from them, worked out by hand:
#: the specials, the word-initial characters, the ## characters, then the merges. Pair counts at the start:
#: (##e ##s) 9, (##s ##t) 9, (##w ##e) 8, (l ##o) 7, (##o ##w) 7, (n ##e) 6, (##e ##w) 6, ... A tie goes to the
#: pair whose first piece came earlier (##e before ##s; l before ##o; n before ##e; ##w, index 15, before ne,
#: 20; w before ##i and ##d; ##d before wi), then to the earlier second piece.
HAND_WORDS = ["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3
HAND_ALPHABET = ["l", "n", "w", "##d", "##e", "##i", "##o", "##r", "##s", "##t", "##w"]
HAND_MERGES = ["##es", "##est", "lo", "low", "ne", "##west", "newest", "wi", "##dest", "widest", "##er", "lower"]


def _hand_vocab(tmp_path, **kwargs):
    path = tmp_path / "hand.txt"
    path.write_text(" ".join(HAND_WORDS) + "\n", encoding="utf-8")
    return _load("bert_data").learn_vocab([str(path)], **kwargs), str(path)


def test_learned_vocabulary_is_the_hand_computed_one(tmp_path):
    """Every merge in order; ``min_frequency`` stops before the pairs seen twice; ``vocab_size`` cuts the list."""
    specials = _load("bert_data").SPECIAL_TOKENS
    vocab, _ = _hand_vocab(tmp_path, vocab_size=1000, min_frequency=1)
    assert vocab == specials + HAND_ALPHABET + HAND_MERGES
    assert _hand_vocab(tmp_path, vocab_size=1000, min_frequency=3)[0] == specials + HAND_ALPHABET + HAND_MERGES[:10]
    assert _hand_vocab(tmp_path, vocab_size=21, min_frequency=1)[0] == specials + HAND_ALPHABET + HAND_MERGES[:5]


def test_learned_tokenizer_reads_every_training_word_whole(tmp_path):
    _, path = _hand_vocab(tmp_path)
    tokenizer = _load("bert_data").learn_tokenizer([path], vocab_size=1000, min_frequency=1)
    assert tokenizer.encode("Lower newest widest low", add_special_tokens=False).tokens == [
        "lower", "newest", "widest", "low"]
    assert tokenizer.encode("slow", add_special_tokens=False).tokens == ["[UNK]"]  # no "s" to start a word


def test_learned_vocabulary_is_the_same_in_every_process(corpus, tmp_path):
    """Three fresh processes learn the corpus' vocabulary: the same tokens in the same order (HuggingFace's
    trainer numbers its ## pieces in hash-map order, so its vocabulary differs from process to process)."""
    paths, _ = corpus
    script = ("import hashlib, sys; sys.path.insert(0, sys.argv[1]); from model_zoo.bert import bert_data; "
              "v = bert_data.learn_vocab(sys.argv[2:], vocab_size=90, min_frequency=1); "
              "print(len(v), hashlib.sha256(chr(10).join(v).encode()).hexdigest())")
    outputs = {subprocess.run([sys.executable, "-c", script, REPO, *paths], capture_output=True, text=True,
                              check=True, timeout=120).stdout for _ in range(3)}
    assert len(outputs) == 1 and outputs.pop().startswith("90 ")


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
    assert "epoch 2/2 step 2/2 (global 4) loss" in printed and "tokens/s" in printed, printed
    assert "epoch 2/2 done: 2 steps in" in printed and "elapsed" in printed and "\r" not in printed

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


def _run_train(args, cwd, timeout=600):
    """model_zoo/bert/train.py as a user runs it (a file, from another directory)."""
    return subprocess.run([sys.executable, BERT_TRAIN, *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout)


def _stderr_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["missing", "not_utf8", "bad_option"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(corpus, tmp_path, case):
    """A missing or non-UTF-8 text file, or a bad option value: one line on stderr, exit status 2, and
    neither the output directory nor anything else in the working directory is created."""
    paths, _ = corpus
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    latin = tmp_path / "latin.txt"
    latin.write_bytes("na\xefve caf\xe9 text\n".encode("latin-1") * 50)
    data, extra, expect = {"missing": ([str(tmp_path / "nope.txt")], [], "text file not found"),
                           "not_utf8": ([str(latin)], [], "valid UTF-8"),
                           "bad_option": (paths, ["--batch-size", "0"], "--batch-size: must be >= 1")}[case]
    out = tmp_path / "out"
    proc = _run_train(["--data", *data, "--config", "tiny", "--vocab-size", "60", "--output-dir", str(out), *extra],
                      cwd)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists() and os.listdir(cwd) == []


@pytest.mark.slow
def test_diverging_run_stops_with_one_line_and_keeps_only_finite_checkpoints(corpus, tmp_path):
    """Lamb at lr 1e8 diverges within a few steps: exit status 1, one line on stderr naming the step and
    the last finite checkpoint, which is still on disk although --keep-checkpoints is 1; every
    checkpoint left is finite."""
    paths, vocab = corpus
    out = tmp_path / "out"
    proc = _run_train(["--data", *paths, "--vocab", vocab, "--config", "tiny", "--seq-length", "32", "--batch-size",
                       "8", "--max-predictions", "5", "--epochs", "3", "--steps-per-epoch", "3", "--lr", "1e8",
                       "--save-steps", "1", "--keep-checkpoints", "1", "--no-sink", "--output-dir", str(out)],
                      tmp_path)
    lines = _stderr_lines(proc)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == 1 and "became" in lines[0] and "training stopped" in lines[0], proc.stderr
    ckpts = sorted(f for f in os.listdir(out) if f.endswith(".ckpt"))
    assert ckpts and not any(f.endswith("_final.ckpt") for f in ckpts)
    assert f"last finite checkpoint {out / ckpts[-1]}" in lines[0]
    for name in ckpts:
        for key, value in ms.load_checkpoint(str(out / name)).items():
            value = value.asnumpy()
            if np.issubdtype(value.dtype, np.floating):
                assert np.all(np.isfinite(value)), (name, key)
