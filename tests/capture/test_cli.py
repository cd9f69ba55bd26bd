"""The `kernelforge capture` command: the user's own errors, --show, the entry forms, and life without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelforge_tui.cli.main import main
from kernelforge_tui.errors import install_fix

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch  # noqa: F401
else:
    pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

ROOT = Path(__file__).resolve().parents[2]
DIFFUSION = ROOT / "examples" / "models" / "diffusion_block.py"

BROKEN = """import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        h = self.proj(x)
        return self.explode(h)

    def explode(self, h):
        raise ValueError(f"boom at {tuple(h.shape)}")


def build(device="cpu"):
    return Model().to(device), (torch.randn(2, 8, device=device),)
"""

TWO_FUNCTIONS = """import torch
from torch import nn


def make_model(device, width=8):
    return nn.Sequential(nn.Linear(width, width), nn.SiLU()).to(device).eval()


def make_inputs(device, width=8):
    return {"input": torch.randn(3, width, device=device)}
"""


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_model_that_raises_shows_the_users_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    model = tmp_path / "broken_model.py"
    model.write_text(BROKEN)
    code, out = run(["capture", str(model), "-o", str(tmp_path / "out")], capsys)
    assert code == 2
    assert f"{model}:15: the forward pass failed: ValueError: boom at (2, 4)" in out
    assert f'File "{model}", line 12, in forward' in out  # the user's frames, in order
    assert "kernelforge_tui" not in out and "_python_dispatch" not in out  # none of ours
    assert not (tmp_path / "out").exists()
    model.write_text("import torch\n\nSCALE = 1 / 0\n")
    code, out = run(["capture", str(model), "-o", str(tmp_path / "out"), "--json"], capsys)
    error = json.loads(out)
    assert code == 2 and error["error"] == "bad-input"
    assert error["message"].startswith(f"{model}:3: import failed: ZeroDivisionError")


def test_a_syntax_error_names_the_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "typo.py"
    model.write_text("import torch\n\n\ndef build(device):\n    return torch.nn.Identity(), (torch.ones(2) +* 2,)\n")
    code, out = run(["capture", str(model), "-o", str(tmp_path / "out"), "--json"], capsys)
    error = json.loads(out)
    assert code == 2 and error["error"] == "bad-input"
    first, line, caret = error["message"].splitlines()
    assert first == f"{model}:5:49: import failed: SyntaxError: invalid syntax"
    assert line == "    return torch.nn.Identity(), (torch.ones(2) +* 2,)"
    assert caret.index("^") == line.index("*")  # under the column
    sibling = tmp_path / "helpers.py"
    sibling.write_text("def f(:\n    pass\n")
    model.write_text("import helpers\n")
    code, out = run(["capture", str(model), "-o", str(tmp_path / "out"), "--json"], capsys)
    message = json.loads(out)["message"]
    assert message.startswith(f"{sibling}:1:7: import failed: SyntaxError: ")  # where the error is
    assert f'File "{model}", line 1, in <module>' in message  # and how the model reached it
    assert "importlib" not in message and "<frozen" not in message


def test_an_error_inside_torch_names_the_call_that_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    model = tmp_path / "shapes.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\ndef build(device):\n"
        "    return nn.Linear(8, 4).to(device), (torch.randn(2, 7, device=device),)\n"
    )
    code, out = run(["capture", str(model), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and "mat1 and mat2 shapes cannot be multiplied (2x7 and 8x4)" in out
    assert "linear.py" in out and "in forward" in out and "kernelforge_tui" not in out


def test_entry_problems_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.py"
    model.write_text(TWO_FUNCTIONS)
    code, out = run(["capture", str(model), "-o", str(tmp_path / "o"), "--json"], capsys)
    assert code == 2 and "no function 'build'" in json.loads(out)["message"]
    assert "make_inputs" in json.loads(out)["message"]  # what the file does define
    code, out = run(["capture", str(model), "--entry", "make_model", "-o", str(tmp_path / "o"), "--json"], capsys)
    assert code == 2 and "returned Sequential" in json.loads(out)["message"]
    code, out = run(["capture", str(tmp_path / "missing.py"), "--json"], capsys)
    assert code == 2 and "no such file" in json.loads(out)["message"]


def test_two_entry_functions_keyword_inputs_and_kwargs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.py"
    model.write_text(TWO_FUNCTIONS)
    out_dir = tmp_path / "m.capture"
    args = ["capture", str(model), "--entry", "make_model:make_inputs", "--kwarg", "width=16", "-o", str(out_dir)]
    code, out = run([*args, "--device", "cpu", "--repeats", "1", "--json"], capsys)
    assert code == 0, out
    manifest = json.loads(out)
    assert manifest["entry"] == "make_model:make_inputs" and manifest["entry_kwargs"] == {"width": 16}
    silu = [v for v in manifest["variants"] if (v["card"] or "").startswith("silu_")]
    assert [v["card"] for v in silu] == ["silu_f32_3x16"]  # width 16 reached the functions
    code, out = run([*args, "--json"], capsys)
    assert code == 2 and "exists: pass --force" in json.loads(out)["message"]


def test_show_prints_the_ranked_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    out_dir = tmp_path / "d.capture"
    code, out = run(["capture", str(DIFFUSION), "-o", str(out_dir), "--device", "cpu", "--repeats", "1"], capsys)
    assert code == 0, out
    code, shown = run(["capture", "--show", str(out_dir)], capsys)
    assert code == 0
    lines = shown.splitlines()
    row = {name: next(k for k, line in enumerate(lines) if name in line) for name in ("group_norm_bf16", "convolution")}
    assert row["group_norm_bf16"] < row["convolution"]  # carded variants first, by expected saving
    assert "broadcast operands" in shown and "views and allocations" in shown and "expected saving" in shown
    assert "no convolution template can serve it" in shown and "channels_last" in shown
    assert "CPU capture" in shown
    code, shown = run(["capture", "--show", str(tmp_path)], capsys)
    assert code == 2 and "no capture manifest here" in shown


def _without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run Python with `import torch` failing, as on a machine without the torch extra."""
    prelude = "import sys\nsys.modules['torch'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=cwd, capture_output=True, text=True, timeout=120,
        env=os.environ | {"COLUMNS": "200", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_without_torch_capture_says_how_to_install_it_and_the_rest_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fix = install_fix("torch")
    assert f" -m pip install -e '{ROOT}[torch]'" in fix  # from a checkout: the checkout's own form, as doctor gives
    code = (
        "from kernelforge_tui.cli.main import main\n"
        f"print('exit', main(['capture', {str(DIFFUSION)!r}, '-o', {str(tmp_path / 'x')!r}]))\n"
        "print('loaded', sorted(m for m in sys.modules if m.startswith('kernelforge_tui.capture')))\n"
    )
    result = _without_torch(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "exit 2" in result.stdout
    assert fix in result.stdout and "kernelforge-tui[torch]" not in result.stdout
    assert "kernelforge_tui.capture.recorder" not in result.stdout


def test_no_module_outside_capture_and_cast_loads_torch() -> None:
    """Every module but the torch-side ones imported in one fresh interpreter: none loads torch."""
    import pkgutil

    import kernelforge_tui

    names = sorted(
        m.name
        for m in pkgutil.walk_packages(kernelforge_tui.__path__, "kernelforge_tui.")
        if m.name not in ("kernelforge_tui.capture.recorder", "kernelforge_tui.gpu.worker")
        and not m.name.startswith("kernelforge_tui.cast")
        and not m.name.endswith(".__main__")
    )
    assert "kernelforge_tui.capture.run" in names and "kernelforge_tui.cli.capture" in names
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)\nprint('ok')\n"
    result = _without_torch(code, ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
