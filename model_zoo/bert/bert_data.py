"""Masked-LM pretraining data from plain text files, with a WordPiece vocabulary.

Tokenisation uses HuggingFace ``tokenizers`` (``pip install tokenizers``; part of ms_optim's
``examples`` extra): :func:`learn_vocab` learns a WordPiece vocabulary from the text files (the same
one on every run), :func:`learn_tokenizer` is a tokenizer over it (in memory), :func:`save_vocab` writes
it as ``vocab.txt`` (the BERT format, usable by any BERT tokenizer), :func:`train_vocab` does both;
:func:`load_tokenizer` reads one. Bad input raises ``ValueError`` or
``FileNotFoundError`` naming the file.

Examples: the whole corpus is tokenised into one stream, cut into segments of ``seq_length - 2``
tokens and framed as ``[CLS] segment [SEP]`` (the last segment padded). Every epoch masks afresh, as
BERT does: 15% of the real tokens (at most ``max_predictions``, at least one) are chosen; of those 80%
become ``[MASK]``, 10% a random token and 10% stay. The dataset's six columns are ``input_ids``,
``input_mask``, ``token_type_ids``, ``masked_lm_positions``, ``masked_lm_ids`` (int32) and
``masked_lm_weights`` (float32, 0 for padding predictions).
"""
from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict
from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["COLUMNS", "learn_vocab", "learn_tokenizer", "save_vocab", "train_vocab", "load_tokenizer",
           "tokenize_corpus", "MaskedLMSource", "create_dataset"]

COLUMNS = ["input_ids", "input_mask", "token_type_ids", "masked_lm_positions", "masked_lm_ids",
           "masked_lm_weights"]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _tokenizer_class():
    try:
        from tokenizers import BertWordPieceTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the BERT example needs HuggingFace tokenizers: pip install tokenizers "
                          "(or pip install 'ms_optim[examples]')") from exc
    return BertWordPieceTokenizer


def _check_files(files: Sequence[str]) -> List[str]:
    files = [str(f) for f in files]
    if not files:
        raise ValueError("no text files given")
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"text file not found: {path}")
    return files


def _read_lines(path: str) -> List[str]:
    """The non-blank lines of a UTF-8 text file, stripped; ``ValueError`` naming the file and the first bad byte
    otherwise."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {path} is not valid UTF-8 (byte {exc.object[exc.start]:#04x} at offset "
                         f"{exc.start})") from None


def _word_counts(files: Sequence[str], tokenizer) -> Counter:
    """How often each word occurs in ``files``, words split as ``tokenizer`` splits them (BERT's
    normalisation and punctuation rules)."""
    counts: Counter = Counter()
    for path in files:
        for line in _read_lines(path):
            text = tokenizer.normalizer.normalize_str(line)
            counts.update(word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text))
    return counts


def learn_vocab(files: Sequence[str], vocab_size: int = 30522, min_frequency: int = 2,
                lowercase: bool = True) -> List[str]:
    """A WordPiece vocabulary learned from ``files`` by byte-pair merges, the same list on every run.

    Words are split as BERT's tokenizer splits them (normalisation, punctuation). The tokens are the special
    tokens, then every character that starts a word (sorted), every ``##`` character that continues one
    (sorted), then the merged pieces in the order they were learned. Each merge joins the adjacent pair of
    pieces that occurs most often over all words (counted with the words' frequencies; a tie goes to the pair
    whose first, then second, piece came earlier in the vocabulary) into one piece: ``a`` + ``##b`` -> ``ab``,
    ``##a`` + ``##b`` -> ``##ab``. Learning stops at ``vocab_size`` tokens or when no pair occurs
    ``min_frequency`` times. (HuggingFace's own trainer numbers its ``##`` pieces in hash-map order, so its
    vocabulary, and with it every token id of a run, varies from one process to the next.)
    """
    files = _check_files(files)
    counts = _word_counts(files, _tokenizer_class()(lowercase=lowercase))
    words = sorted(counts)
    pieces = [[w[0]] + ["##" + c for c in w[1:]] for w in words]
    freq = [counts[w] for w in words]
    alphabet = {p for word in pieces for p in word} - set(SPECIAL_TOKENS)
    vocab = list(SPECIAL_TOKENS) + sorted(alphabet, key=lambda p: (p.startswith("##"), p))
    rank = {token: i for i, token in enumerate(vocab)}
    pairs: Dict[Tuple[str, str], int] = defaultdict(int)
    where: Dict[Tuple[str, str], set] = defaultdict(set)
    for i, word in enumerate(pieces):
        for pair in zip(word, word[1:]):
            pairs[pair] += freq[i]
            where[pair].add(i)

    def entry(pair):  # the most frequent pair first; ties: the pair of the earlier tokens
        return -pairs[pair], rank[pair[0]], rank[pair[1]], pair

    heap = [entry(pair) for pair in pairs]
    heapq.heapify(heap)
    while heap and len(vocab) < vocab_size:
        negative, _, _, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -negative:  # a stale entry: the count changed since it was pushed
            continue
        if -negative < min_frequency:
            break
        merged = pair[0] + pair[1][2:]
        if merged not in rank:
            rank[merged] = len(vocab)
            vocab.append(merged)
        changed = set()
        for i in where.pop(pair):  # any order: each word's counts are added and removed alike
            word = pieces[i]
            for old in zip(word, word[1:]):
                pairs[old] -= freq[i]
                changed.add(old)
            out, j = [], 0
            while j < len(word):
                if j + 1 < len(word) and (word[j], word[j + 1]) == pair:
                    out.append(merged)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            pieces[i] = out
            for new in zip(out, out[1:]):
                pairs[new] += freq[i]
                where[new].add(i)
                changed.add(new)
        for key in changed:
            if pairs[key] > 0:
                heapq.heappush(heap, entry(key))
            else:
                pairs.pop(key, None)
    return vocab


def learn_tokenizer(files: Sequence[str], vocab_size: int = 30522, min_frequency: int = 2,
                    lowercase: bool = True):
    """A WordPiece tokenizer over :func:`learn_vocab`'s vocabulary of ``files`` (in memory; nothing written)."""
    vocab = learn_vocab(files, vocab_size, min_frequency, lowercase)
    return _tokenizer_class()({token: i for i, token in enumerate(vocab)}, lowercase=lowercase)


def save_vocab(tokenizer, out_dir: str) -> str:
    """Write the tokenizer's vocabulary as ``out_dir/vocab.txt`` (directory created); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    return tokenizer.save_model(out_dir)[0]


def train_vocab(files: Sequence[str], out_dir: str, vocab_size: int = 30522, min_frequency: int = 2,
                lowercase: bool = True) -> str:
    """Learn a WordPiece vocabulary from ``files``; write ``out_dir/vocab.txt`` and return its path."""
    return save_vocab(learn_tokenizer(files, vocab_size, min_frequency, lowercase), out_dir)


def load_tokenizer(vocab_file: str, lowercase: bool = True):
    """A WordPiece tokenizer over an existing ``vocab.txt``."""
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"vocabulary file not found: {vocab_file}")
    tokenizer = _tokenizer_class()(vocab_file, lowercase=lowercase)
    for token in SPECIAL_TOKENS:
        if tokenizer.token_to_id(token) is None:
            raise ValueError(f"vocabulary {vocab_file} lacks the special token {token}")
    return tokenizer


def tokenize_corpus(files: Sequence[str], tokenizer, seq_length: int) -> np.ndarray:
    """Token ids of every file, framed as ``[CLS] ... [SEP]`` rows of ``seq_length`` (int32, padded)."""
    if seq_length < 4:
        raise ValueError(f"seq_length must be >= 4, but got {seq_length}")
    stream: List[int] = []
    for path in _check_files(files):
        lines = _read_lines(path)
        for encoding in tokenizer.encode_batch(lines, add_special_tokens=False):
            stream.extend(encoding.ids)
    if not stream:
        raise ValueError(f"the text files {list(files)} contain no tokens")
    cls_id, sep_id, pad_id = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    body = seq_length - 2
    rows = []
    for start in range(0, len(stream), body):
        piece = [cls_id] + stream[start:start + body] + [sep_id]
        rows.append(piece + [pad_id] * (seq_length - len(piece)))
    return np.asarray(rows, dtype=np.int32)


class MaskedLMSource:
    """Random-access source for ``GeneratorDataset``: masks row ``i`` afresh on every read."""

    def __init__(self, rows: np.ndarray, vocab_size: int, special_ids: Sequence[int], mask_id: int, pad_id: int,
                 max_predictions: int = 20, mask_prob: float = 0.15, seed: int = 0):
        if rows.ndim != 2:
            raise ValueError(f"rows must be 2-D (examples, seq_length), but got shape {rows.shape}")
        self.rows = rows
        self.vocab_size = vocab_size
        self.special = np.asarray(sorted(set(special_ids)), dtype=np.int32)
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.max_predictions = max_predictions
        self.mask_prob = mask_prob
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        ids = self.rows[int(index)].copy()
        input_mask = (ids != self.pad_id).astype(np.int32)
        candidates = np.flatnonzero(~np.isin(ids, self.special))
        count = min(self.max_predictions, max(1, int(round(len(candidates) * self.mask_prob))), len(candidates))
        chosen = np.sort(self.rng.choice(candidates, size=count, replace=False)) if count else np.zeros(0, int)
        labels = ids[chosen].copy()
        action = self.rng.random(count)
        ids[chosen[action < 0.8]] = self.mask_id
        random_slots = chosen[(action >= 0.8) & (action < 0.9)]
        ids[random_slots] = self.rng.integers(len(SPECIAL_TOKENS), self.vocab_size, size=len(random_slots))
        positions = np.zeros(self.max_predictions, np.int32)
        label_ids = np.zeros(self.max_predictions, np.int32)
        weights = np.zeros(self.max_predictions, np.float32)
        positions[:count], label_ids[:count], weights[:count] = chosen, labels, 1.0
        return (ids.astype(np.int32), input_mask, np.zeros_like(ids, dtype=np.int32), positions, label_ids, weights)


def create_dataset(files: Sequence[str], tokenizer, seq_length: int = 128, batch_size: int = 32,
                   max_predictions: int = 20, shuffle: bool = True, seed: int = 0, repeat: int = 1):
    """A batched ``mindspore.dataset.GeneratorDataset`` with :data:`COLUMNS` (incomplete batch dropped)."""
    import mindspore.dataset as ds

    rows = tokenize_corpus(files, tokenizer, seq_length)
    if len(rows) < batch_size:
        raise ValueError(f"the text gives {len(rows)} examples of {seq_length} tokens, fewer than one batch "
                         f"of {batch_size}: give more text, or a smaller --batch-size/--seq-length")
    special = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    source = MaskedLMSource(rows, tokenizer.get_vocab_size(), special, tokenizer.token_to_id("[MASK]"),
                            tokenizer.token_to_id("[PAD]"), max_predictions=max_predictions, seed=seed)
    dataset = ds.GeneratorDataset(source, column_names=COLUMNS, shuffle=shuffle, num_parallel_workers=1)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if repeat > 1:
        dataset = dataset.repeat(repeat)
    return dataset
