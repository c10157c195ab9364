"""A BERT encoder and its masked-LM pretraining head, in MindSpore (plain ``mindspore.nn`` layers).

The layers are ordinary ``nn.Embedding``, ``nn.Dense`` and ``nn.LayerNorm``, so the same network trains
with Lamb as written, and with THOR after ``ms_optim.nn.thor`` converts its embeddings and dense layers
to ``EmbeddingThor``/``DenseThor`` (the optimizer then treats LayerNorm's gamma and beta with its
diagonal rule). Every ``Dense`` sees a 2-D input (tokens flattened to ``batch*seq_length`` rows), which
is what the THOR layers' factor collection expects.

Sizes: ``CONFIGS["tiny"]`` (for tests and smoke runs), ``"base"`` (BERT-base: 12 layers, hidden 768,
12 heads) and ``"large"`` (24 layers, hidden 1024, 16 heads); the vocabulary size comes from the
WordPiece vocabulary in use.

The MLM output projection is its own ``Dense`` (not tied to the word embedding table), so each weight
has exactly one use and THOR's Kronecker factors describe it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
from mindspore.common.initializer import TruncatedNormal

__all__ = ["BertConfig", "CONFIGS", "get_config", "BertModel", "BertForMaskedLM", "BertPretrainingLoss"]


@dataclasses.dataclass
class BertConfig:
    """Shape and regularisation of the encoder (``vocab_size`` is set from the vocabulary)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    vocab_size: int = 30522

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig: '{name}' must be a positive int, but got {value!r}.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig: 'hidden_size' ({self.hidden_size}) must be a multiple of "
                             f"'num_attention_heads' ({self.num_attention_heads}).")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig: '{name}' must be in [0, 1), but got {value!r}.")


CONFIGS: Dict[str, BertConfig] = {
    "tiny": BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                       max_position_embeddings=128),
    "base": BertConfig(),
    "large": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096),
}


def get_config(name: str, vocab_size: int, **overrides) -> BertConfig:
    """A copy of ``CONFIGS[name]`` with ``vocab_size`` and any field in ``overrides`` replaced."""
    if name not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, but got {name!r}.")
    return dataclasses.replace(CONFIGS[name], vocab_size=vocab_size, **overrides)


def _dense(config: BertConfig, in_features: int, out_features: int) -> nn.Dense:
    return nn.Dense(in_features, out_features, weight_init=TruncatedNormal(config.initializer_range),
                    bias_init="zeros")


def _embedding(config: BertConfig, rows: int) -> nn.Embedding:
    return nn.Embedding(rows, config.hidden_size, embedding_table=TruncatedNormal(config.initializer_range))


class BertEmbeddings(nn.Cell):
    """word + position + token-type embeddings, then LayerNorm and dropout; output (B*S, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = _embedding(config, config.vocab_size)
        self.position_embeddings = _embedding(config, config.max_position_embeddings)
        self.token_type_embeddings = _embedding(config, config.type_vocab_size)
        self.layer_norm = nn.LayerNorm((config.hidden_size,), epsilon=config.layer_norm_eps)
        self.dropout = nn.Dropout(p=config.hidden_dropout_prob)
        self.hidden_size = config.hidden_size

    def construct(self, input_ids, token_type_ids):
        batch, seq = input_ids.shape
        positions = ops.tile(ops.arange(seq, dtype=ms.int32).reshape(1, seq), (batch, 1))
        out = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
               + self.token_type_embeddings(token_type_ids))
        out = out.reshape(batch * seq, self.hidden_size)
        return self.dropout(self.layer_norm(out))


class BertSelfAttention(nn.Cell):
    """Multi-head self-attention on flattened tokens (B*S, H) with an additive padding mask."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.query = _dense(config, config.hidden_size, config.hidden_size)
        self.key = _dense(config, config.hidden_size, config.hidden_size)
        self.value = _dense(config, config.hidden_size, config.hidden_size)
        self.output = _dense(config, config.hidden_size, config.hidden_size)
        self.attention_dropout = nn.Dropout(p=config.attention_probs_dropout_prob)
        self.dropout = nn.Dropout(p=config.hidden_dropout_prob)
        self.layer_norm = nn.LayerNorm((config.hidden_size,), epsilon=config.layer_norm_eps)
        self.softmax = nn.Softmax(axis=-1)
        self.scale = 1.0 / math.sqrt(self.head_size)

    def _split(self, x, batch, seq):
        return x.reshape(batch, seq, self.heads, self.head_size).transpose(0, 2, 1, 3)

    def construct(self, hidden, mask_bias, batch, seq):
        q = self._split(self.query(hidden), batch, seq)
        k = self._split(self.key(hidden), batch, seq)
        v = self._split(self.value(hidden), batch, seq)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + mask_bias
        probs = self.attention_dropout(self.softmax(scores))
        context = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(batch * seq, self.hidden_size)
        return self.layer_norm(hidden + self.dropout(self.output(context)))


class BertLayer(nn.Cell):
    """Self-attention, then the GELU feed-forward block, each with residual + LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.intermediate = _dense(config, config.hidden_size, config.intermediate_size)
        self.gelu = nn.GELU(approximate=False)
        self.output = _dense(config, config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(p=config.hidden_dropout_prob)
        self.layer_norm = nn.LayerNorm((config.hidden_size,), epsilon=config.layer_norm_eps)

    def construct(self, hidden, mask_bias, batch, seq):
        attended = self.attention(hidden, mask_bias, batch, seq)
        ffn = self.output(self.gelu(self.intermediate(attended)))
        return self.layer_norm(attended + self.dropout(ffn))


class BertModel(nn.Cell):
    """The encoder: ``(input_ids, input_mask, token_type_ids)`` (B, S) int32 -> hidden states (B*S, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.CellList([BertLayer(config) for _ in range(config.num_hidden_layers)])

    def construct(self, input_ids, input_mask, token_type_ids):
        batch, seq = input_ids.shape
        hidden = self.embeddings(input_ids, token_type_ids)
        # 0 where a token may be attended to, -10000 at padding: broadcast over heads and queries.
        mask_bias = (1.0 - input_mask.astype(ms.float32)).reshape(batch, 1, 1, seq) * -10000.0
        for layer in self.layers:
            hidden = layer(hidden, mask_bias, batch, seq)
        return hidden


class BertForMaskedLM(nn.Cell):
    """Encoder + MLM head (dense, GELU, LayerNorm, projection to the vocabulary) at the masked positions.

    ``masked_lm_positions`` (B, P) int32 index the sequence; returns logits (B*P, vocab_size).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.bert = BertModel(config)
        self.transform = _dense(config, config.hidden_size, config.hidden_size)
        self.gelu = nn.GELU(approximate=False)
        self.layer_norm = nn.LayerNorm((config.hidden_size,), epsilon=config.layer_norm_eps)
        self.decoder = _dense(config, config.hidden_size, config.vocab_size)
        self.hidden_size = config.hidden_size

    def construct(self, input_ids, input_mask, token_type_ids, masked_lm_positions):
        batch, seq = input_ids.shape
        hidden = self.bert(input_ids, input_mask, token_type_ids)
        offsets = (ops.arange(batch, dtype=ms.int32) * seq).reshape(batch, 1)
        flat_positions = (masked_lm_positions + offsets).reshape(-1)
        picked = ops.gather(hidden, flat_positions, 0)
        picked = self.layer_norm(self.gelu(self.transform(picked)))
        return self.decoder(picked)


class BertPretrainingLoss(nn.Cell):
    """Masked-LM cross entropy averaged over the real (weight 1) predictions of the batch.

    Takes the dataset's six columns, so ``Model(BertPretrainingLoss(net), optimizer=...)`` trains it.
    """

    def __init__(self, network: BertForMaskedLM):
        super().__init__()
        self.network = network
        self.cross_entropy = nn.CrossEntropyLoss(reduction="none")

    def construct(self, input_ids, input_mask, token_type_ids, masked_lm_positions, masked_lm_ids,
                  masked_lm_weights):
        logits = self.network(input_ids, input_mask, token_type_ids, masked_lm_positions)
        per_token = self.cross_entropy(logits, masked_lm_ids.reshape(-1))
        weights = masked_lm_weights.reshape(-1)
        return (per_token * weights).sum() / ops.maximum(weights.sum(), 1.0)
