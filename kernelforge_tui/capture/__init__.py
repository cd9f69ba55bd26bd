"""PyTorch capture: a model's aten calls, grouped into variants, ranked by the time a faster kernel could save, and
an operator card for each variant the product can optimise (`kernelforge capture`).

Importing this package (and `manifest`, `calls`, `patterns`, `families`, `ranking`, `cards`, `loader`, `run`) needs no
torch: only `recorder` imports it, and `run.capture_model` loads it when a capture runs. What other parts read is the
manifest: `load_capture(dir) -> CaptureManifest`, its `Variant`s with their `steps` (overload, arguments with shapes,
strides, dtypes, scalar values), `bindings` (which card tensor is which argument or result) and `card` directory.
"""

from kernelforge_tui.capture.manifest import (
    MANIFEST,
    ArgSpec,
    Binding,
    CaptureError,
    CaptureManifest,
    Step,
    TensorMeta,
    Variant,
    card_dir,
    is_capture_dir,
    load_capture,
)

__all__ = [
    "MANIFEST",
    "ArgSpec",
    "Binding",
    "CaptureError",
    "CaptureManifest",
    "Step",
    "TensorMeta",
    "Variant",
    "card_dir",
    "is_capture_dir",
    "load_capture",
]
