"""A BERT encoder laid out exactly as Hugging Face's BertModel, without the transformers package.

Module and parameter names follow BertModel (embeddings.word_embeddings, encoder.layer.N.attention.
self.query, ...), so a BertModel state_dict loads into it unchanged and its ONNX export has the
node structure that real BERT exports have: additive mask (1 - mask) * -10000 broadcast as
[B, 1, 1, S], scores / sqrt(head_dim), softmax, per-head reshapes/transposes, erf GELU, and
LayerNorm after each residual add.

Invariant: the forward pass is a pure function of (input_ids, attention_mask) in eval mode;
dropout modules exist for layout fidelity but every dropout is identity at inference.

    cfg = BertConfig.base()                     # BERT-Base: 12 layers, 768 hidden, 12 heads
    cfg = BertConfig.small()                    # 2 layers, 128 hidden: for fast tests
    model = BertModel(cfg).eval(); init_weights(model, seed=0)
    hidden, pooled = model(input_ids, attention_mask)
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    add_pooler: bool = True

    @staticmethod
    def base():
        return BertConfig()

    @staticmethod
    def small(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000, max_positions=64):
        return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=intermediate,
                          max_position_embeddings=max_positions)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.register_buffer("position_ids",
                             torch.arange(cfg.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids, token_type_ids=None):
        seq = input_ids.shape[1]
        position_ids = self.position_ids[:, :seq]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.hidden_size % cfg.num_attention_heads != 0:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        self.num_attention_heads = cfg.num_attention_heads
        self.attention_head_size = cfg.hidden_size // cfg.num_attention_heads
        self.all_head_size = cfg.hidden_size
        self.query = nn.Linear(cfg.hidden_size, self.all_head_size)
        self.key = nn.Linear(cfg.hidden_size, self.all_head_size)
        self.value = nn.Linear(cfg.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(cfg.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        # [B, S, H] -> [B, heads, S, head_size]
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, extended_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / math.sqrt(self.attention_head_size)
        scores = scores + extended_mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.all_head_size,))


class BertSelfOutput(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, hidden_states, extended_mask):
        return self.output(self.self(hidden_states, extended_mask), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, hidden_states):
        return F.gelu(self.dense(hidden_states))  # exact (erf) GELU, as BERT's "gelu"


class BertOutput(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, hidden_states, extended_mask):
        attn = self.attention(hidden_states, extended_mask)
        return self.output(self.intermediate(attn), attn)


class BertEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, hidden_states, extended_mask):
        for layer in self.layer:
            hidden_states = layer(hidden_states, extended_mask)
        return hidden_states


class BertPooler(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class BertModel(nn.Module):
    """forward(input_ids [B,S] int64, attention_mask [B,S] int64 of 0/1) ->
    (last_hidden_state [B,S,H], pooler_output [B,H]) or just last_hidden_state without pooler."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if cfg.add_pooler else None

    def forward(self, input_ids, attention_mask):
        # [B, S] -> [B, 1, 1, S]: 0 where attended, -10000 where masked, added to every score row.
        ext = attention_mask[:, None, None, :].to(dtype=torch.float32)
        ext = (1.0 - ext) * -10000.0
        hidden = self.encoder(self.embeddings(input_ids), ext)
        if self.pooler is None:
            return hidden
        return hidden, self.pooler(hidden)


def init_weights(model, seed=0):
    """BERT's initialisation (weights normal with std 0.02), from a fixed seed.

    Biases and LayerNorm shifts get small random values and LayerNorm scales 1 + small noise,
    instead of BERT's 0 and 1: a runtime that drops or swaps one is then caught by a numeric
    comparison, and the exporter does not merge the many equal all-zero tensors into Identity
    nodes that no trained model has.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * 0.02)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=gen) * 0.02)
            elif isinstance(mod, nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * 0.02)
                if mod.padding_idx is not None:
                    mod.weight[mod.padding_idx].zero_()
            elif isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(1.0 + 0.1 * torch.randn(mod.weight.shape, generator=gen))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=gen))
    return model


def build_bert(cfg, seed=0):
    """A BertModel for `cfg` in eval mode with deterministic weights."""
    return init_weights(BertModel(cfg), seed).eval()


def example_inputs(cfg, batch, seq, seed=0, pad=0):
    """(input_ids, attention_mask), int64 [batch, seq], padded as a tokenizer pads a batch: the
    last pad[b] positions of row b hold id 0 and mask 0 (`pad`: one int for all rows, or a list
    with one per row)."""
    pads = [pad] * batch if isinstance(pad, int) else list(pad)
    if len(pads) != batch or not all(0 <= p < seq for p in pads):
        raise ValueError("pad needs one value in [0, seq) per row")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for b, p in enumerate(pads):
        if p:
            ids[b, seq - p:] = 0
            mask[b, seq - p:] = 0
    return ids, mask
