"""A Llama-style decoder block built in code (no weights downloaded): RMS norm, rotary embedding, causal attention
with an explicit softmax, SwiGLU feed-forward, two residual adds.

Capture it with `kernelforge capture examples/models/decoder_block.py --device cuda` (bf16 on the GPU, with the sizes
of a ~1B-parameter model's layer) or `--device cpu` (small sizes for a quick look; bf16 too: every op here has a
bf16 CPU kernel in torch 2.4 and later). `build(device, size, dtype)` is the capture entry: it returns the module
(in eval mode) and its example inputs.

Written so that the operators the product can optimise show up as such: `F.rms_norm` (one fused aten call on CUDA,
its decomposition on the CPU; both become an rms_norm card, eps 1e-6 as the template library's kernels use),
`torch.softmax` over the last axis of the attention scores (a softmax card), and `F.silu(gate) * up` (a silu_mul
elementwise card). The projections and the attention matmuls are matrix products (cuBLAS; listed as unsupported).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    # dim, heads, ffn, batch, seq
    "full": (2048, 16, 5632, 2, 1024),
    "small": (64, 4, 96, 2, 16),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim).uniform_(0.5, 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + self.mask[:s, :s]
        attn = torch.softmax(scores, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(out)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, seq: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, seq)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


def build(
    device: str = "cpu", size: str | None = None, dtype: str = "bfloat16"
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The block and one input batch: `size` "full" on CUDA, "small" on the CPU unless given."""
    dim, heads, hidden, batch, seq = SIZES[size or ("full" if device.startswith("cuda") else "small")]
    torch.manual_seed(0)
    model = DecoderBlock(dim, heads, hidden, seq).to(device=device, dtype=getattr(torch, dtype)).eval()
    x = torch.randn(batch, seq, dim, device=device, dtype=getattr(torch, dtype))
    return model, (x,)
