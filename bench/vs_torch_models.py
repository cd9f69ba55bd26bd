"""The torch workloads of `bench/vs_torch.py`, each a tiny model in the form `kernelforge capture` loads.

One entry function per workload, `NAME(device, shape) -> (model, example_inputs)` (bf16, the stencil fp32): capture
runs it (`kernelforge capture bench/vs_torch_models.py --entry softmax --kwarg shape=[4096,32768]`) and makes the
workload's one card, and `bench/vs_torch.py` times the same model eager and under torch.compile on the same inputs.
The shape is a parameter (the goal's shape on the GPU, small ones in the CPU tests); the goal shapes live in
`bench/vs_torch.py`'s workload table, not here.

Weights and biases are seeded and spread around 1 and 0 (not the constant 1 and 0 a fresh module holds): a card whose
weight is constant in every set cannot tell a kernel that ignores it (capture widens constants, and says so).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEED = 14
GROUPS = 32
"""group_norm's groups (the issue's workload)."""
RMS_EPS = 1e-6


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def _normal(shape: list[int], dtype: torch.dtype, device: str, generator: torch.Generator) -> torch.Tensor:
    """Drawn on the CPU (the same values on any device), then moved."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype=dtype, device=device)


def _affine(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Weight about 1, bias about 0, seeded; in place (under no_grad: parameters refuse in-place writes otherwise)."""
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = 0.1 * torch.randn(parameter.shape, generator=generator)
            parameter.copy_(noise + (1.0 if name == "weight" else 0.0))
    return module


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class Gelu(nn.Module):
    """The exact (erf) GELU: approximate="none"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


class AvgPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 1)


class SiluMul(nn.Module):
    """SwiGLU's product: capture fuses silu(gate) * up into one card."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class Stencil5(nn.Module):
    """One 5-point Jacobi step, the suite's stencil_2d in torch (the task has no vendor): v = u on the boundary,
    the mean of the 4 neighbours inside. A clone and a slice assignment, as one writes it in torch."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        v = u.clone()
        v[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
        return v


Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _one_input(model: nn.Module, shape: list[int], dtype: torch.dtype, device: str) -> Built:
    generator = _generator()
    x = _normal(shape, dtype, device, generator)
    return model.to(device=device, dtype=dtype).eval(), (x,)


def softmax(device: str, shape: list[int]) -> Built:
    return _one_input(Softmax(), shape, torch.bfloat16, device)


def layer_norm(device: str, shape: list[int]) -> Built:
    model = _affine(nn.LayerNorm(shape[-1]), _generator())
    return _one_input(model, shape, torch.bfloat16, device)


def rms_norm(device: str, shape: list[int]) -> Built:
    model = _affine(nn.RMSNorm(shape[-1], eps=RMS_EPS), _generator())
    return _one_input(model, shape, torch.bfloat16, device)


def group_norm(device: str, shape: list[int]) -> Built:
    model = _affine(nn.GroupNorm(GROUPS, shape[1]), _generator())
    return _one_input(model, shape, torch.bfloat16, device)


def gelu(device: str, shape: list[int]) -> Built:
    return _one_input(Gelu(), shape, torch.bfloat16, device)


def avg_pool(device: str, shape: list[int]) -> Built:
    return _one_input(AvgPool(), shape, torch.bfloat16, device)


def silu_mul(device: str, shape: list[int]) -> Built:
    generator = _generator()
    gate = _normal(shape, torch.bfloat16, device, generator)
    up = _normal(shape, torch.bfloat16, device, generator)
    return SiluMul().to(device).eval(), (gate, up)


def stencil(device: str, shape: list[int]) -> Built:
    return _one_input(Stencil5(), shape, torch.float32, device)
