"""A diffusion-style residual block built in code (no weights downloaded), as in a UNet's ResnetBlock2D: group norm,
SiLU, 3x3 convolution, a time-embedding projection added per channel, group norm, SiLU, convolution, residual add.

Capture it with `kernelforge capture examples/models/diffusion_block.py --device cuda` (bf16, 512 channels at 64x64,
the size of a Stable Diffusion UNet's middle blocks) or `--device cpu` (small sizes; bf16 too). `build(device, size,
dtype)` is the capture entry.

The group norms become group_norm cards (32 groups, eps 1e-5 as the template library's kernels use; diffusers uses
1e-6 by default, which would make cards that only an LLM proposer can serve), the SiLUs elementwise cards, the
residual add an elementwise add card, the two 3x3 convolutions one convolution card (no template yet: LLM
proposers only), and the time-embedding add broadcasts over the image (unsupported: elementwise cards take operands
of one shape).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    # batch, channels, height/width, time-embedding width
    "full": (4, 512, 64, 1280),
    "small": (2, 64, 8, 32),
}


class ResnetBlock(nn.Module):
    def __init__(self, channels: int, temb: int, groups: int = 32, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels, eps=eps)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.time_proj = nn.Linear(temb, channels)
        self.norm2 = nn.GroupNorm(groups, channels, eps=eps)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        for norm in (self.norm1, self.norm2):  # not the identity, so a kernel that skips them fails
            nn.init.uniform_(norm.weight, 0.5, 1.5)
            nn.init.uniform_(norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


def build(
    device: str = "cpu", size: str | None = None, dtype: str = "bfloat16"
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The block and one input (image latents, time embedding): "full" on CUDA, "small" on the CPU unless given."""
    batch, channels, hw, temb = SIZES[size or ("full" if device.startswith("cuda") else "small")]
    torch.manual_seed(0)
    model = ResnetBlock(channels, temb).to(device=device, dtype=getattr(torch, dtype)).eval()
    x = torch.randn(batch, channels, hw, hw, device=device, dtype=getattr(torch, dtype))
    t = torch.randn(batch, temb, device=device, dtype=getattr(torch, dtype))
    return model, (x, t)
