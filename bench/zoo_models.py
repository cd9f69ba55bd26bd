"""Models the project did not write, for `bench/compile_path.py`: built from installed libraries with random weights,
nothing downloaded, in the form `kernelforge capture` loads (`--entry resnet50`, `--entry llama`, `--entry vit`).

Each entry is `NAME(device, size, dtype) -> (model in eval mode, example inputs)`: "full" on CUDA (a serving-sized
batch), "small" on the CPU. The libraries are not project dependencies (the H200 machine has torchvision, timm and
transformers installed); an entry whose library is missing says which to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch
from torch import nn

SEED = 0


def _library(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RuntimeError(f"this model needs `{name}` (pip install {name}): {exc}") from exc


def _full(device: str, size: str | None) -> bool:
    return (size or ("full" if device.startswith("cuda") else "small")) == "full"


def _ready(model: nn.Module, device: str, dtype: str) -> nn.Module:
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def resnet50(device: str = "cpu", size: str | None = None, dtype: str = "bfloat16") -> tuple[nn.Module, Any]:
    """torchvision's ResNet-50 (random weights), channels-last, on a batch of 224x224 images (32 full, 2 small)."""
    models = _library("torchvision.models")
    torch.manual_seed(SEED)
    model = _ready(models.resnet50(weights=None), device, dtype).to(memory_format=torch.channels_last)
    batch, side = (32, 224) if _full(device, size) else (2, 64)
    x = torch.randn(batch, 3, side, side, device=device, dtype=getattr(torch, dtype))
    return model, (x.contiguous(memory_format=torch.channels_last),)


def vit(device: str = "cpu", size: str | None = None, dtype: str = "bfloat16") -> tuple[nn.Module, Any]:
    """timm's ViT-B/16 at 224 (random weights) on 32 images; small: a 2-block ViT-tiny at 64 on 2 images."""
    timm = _library("timm")
    torch.manual_seed(SEED)
    if _full(device, size):
        model, batch, side = timm.create_model("vit_base_patch16_224", pretrained=False), 32, 224
    else:
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=2)
        batch, side = 2, 64
    x = torch.randn(batch, 3, side, side, device=device, dtype=getattr(torch, dtype))
    return _ready(model, device, dtype), (x,)


class _LastHidden(nn.Module):
    """A transformers model's forward as tensors in, one tensor out (the last hidden state), no cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return out


def llama(device: str = "cpu", size: str | None = None, dtype: str = "bfloat16") -> tuple[nn.Module, Any]:
    """A Hugging Face `LlamaModel` from a config (random weights, no download): full is two layers of a 1B-class
    Llama (hidden 2048, MLP 8192, 32 heads, 8 KV heads) over 2 x 1024 tokens; small is a tiny one."""
    transformers = _library("transformers")
    if _full(device, size):
        dims: dict[str, int] = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32)
        dims |= dict(num_key_value_heads=8, num_hidden_layers=2)
        batch, seq = 2, 1024
    else:
        dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
        dims |= dict(num_hidden_layers=1)
        batch, seq = 2, 16
    config = transformers.LlamaConfig(vocab_size=32000, max_position_embeddings=4096, **dims)
    config._attn_implementation = "sdpa"  # the attention torch.compile sees in serving, not the eager matmuls
    torch.manual_seed(SEED)
    model = _ready(_LastHidden(transformers.LlamaModel(config)), device, dtype)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(SEED))
    return model, (ids.to(device),)
