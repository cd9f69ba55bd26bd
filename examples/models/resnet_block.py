"""A ResNet-style basic block and head built in code (no weights downloaded): 3x3 convolution, batch norm in eval
mode, ReLU, 3x3 convolution, batch norm, residual add, ReLU, then adaptive average pooling to 1x1.

Capture it with `kernelforge capture examples/models/resnet_block.py --device cuda` (bf16, 512 channels at 7x7 with a
batch of 64: a ResNet-50's last stage) or `--device cpu` (small sizes; bf16 too). `build(device, size, dtype)` is
the capture entry.

The batch norms (eval: running statistics) become cards the template library has no kernel family for (an LLM
proposer can serve them; the offline search skips them), the ReLUs and the residual add elementwise cards, and the
pooling a pooling card, the two 3x3 convolutions one convolution card (no template yet: LLM proposers only). Each
batch norm with its ReLU (the second with the residual add between them) is also a fused chain for compiled graphs
(batch_norm_relu, batch_norm_add_relu), which the batch_norm_act template serves. The running statistics are set to
non-trivial values, so a kernel that ignores them fails.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    # batch, channels, height/width
    "full": (64, 512, 7),
    "small": (2, 32, 7),
}


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return bn


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = _batch_norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = _batch_norm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        h = F.relu(h + x)
        return F.adaptive_avg_pool2d(h, 1)


def build(
    device: str = "cpu", size: str | None = None, dtype: str = "bfloat16"
) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The block (eval mode) and one input batch: "full" on CUDA, "small" on the CPU unless given."""
    batch, channels, hw = SIZES[size or ("full" if device.startswith("cuda") else "small")]
    torch.manual_seed(0)
    model = BasicBlock(channels).to(device=device, dtype=getattr(torch, dtype)).eval()
    x = torch.randn(batch, channels, hw, hw, device=device, dtype=getattr(torch, dtype))
    return model, (x,)
