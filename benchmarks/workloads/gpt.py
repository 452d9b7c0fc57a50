"""A small GPT in the shape of the common minimal GPT training scripts, for
the transformer benchmark (benchmarks/gpt.py) and the GPT-script migration
tests (tests/workers/gpt_script.py).

What it shares with those scripts, because each is something a data-parallel
library must get right:
  * token and position embeddings, N pre-norm blocks of causal
    self-attention and an MLP, a final LayerNorm and a language-model head
    whose weight is the token embedding's (weight tying: one parameter held
    by two modules);
  * GPT-2's initialisation (normal(0, 0.02), the residual projections scaled
    by 1/sqrt(2 N));
  * ``optimizer_groups``: AdamW's two groups, weight decay on the matrices
    (dim >= 2), none on biases and LayerNorm weights;
  * no registered buffers: attention is torch's scaled_dot_product_attention
    with is_causal=True (no mask buffer), as the scripts do on torch >= 2.

``token_batches`` makes a learnable synthetic stream: each next token is a
fixed random successor of the current one, with some noise, so the loss
falls well below log(vocab) within a few hundred steps.
"""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


# Named sizes: "test" for the multi-process tests (seconds per route on 2 cores),
# "small" and "medium" for the benchmark.
SIZES = {
    "test": GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32),
    "small": GPTConfig(vocab_size=2048, block_size=128, n_layer=4, n_head=4, n_embd=256),
    "medium": GPTConfig(vocab_size=8192, block_size=256, n_layer=8, n_head=8, n_embd=512),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        assert c.n_embd % c.n_head == 0
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(c.vocab_size, c.n_embd),
                wpe=nn.Embedding(c.block_size, c.n_embd),
                drop=nn.Dropout(c.dropout),
                h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
                ln_f=nn.LayerNorm(c.n_embd, bias=c.bias),
            )
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def optimizer_groups(model: nn.Module, weight_decay: float):
    """AdamW's parameter groups of the scripts: decay on matrices, none on the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def token_batches(c: GPTConfig, batch: int, seed: int, step: int, noise: float = 0.1):
    """(x, y) of ``batch`` sequences for ``step``: the same on every rank for
    the same arguments (slice it per rank). y is x shifted by one token."""
    succ = torch.randperm(c.vocab_size, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 100003 + step)
    seq = torch.empty(batch, c.block_size + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, c.vocab_size, (batch,), generator=g)
    for t in range(1, c.block_size + 1):
        jump = torch.rand(batch, generator=g) < noise
        seq[:, t] = torch.where(jump, torch.randint(0, c.vocab_size, (batch,), generator=g), succ[seq[:, t - 1]])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
