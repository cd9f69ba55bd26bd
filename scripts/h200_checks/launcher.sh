# launcher: the compiled launcher (issue 31, "Eager host cost"). About 75 s: the C++ launcher built into the user
# cache (~15 s) and again in pytest's session cache (~15 s), 8 GPU tests (each builds the small softmax kernel: ~45 s).
# Its host time per call: python bench/cast_gpu.py --run examples/runs/softmax_bf16 --host-only --out DIR.
mkdir -p "$OUT/launcher"
{ g++ --version | head -1; ninja --version; python -c "import torch; print(torch.__version__, torch.version.cuda)"; } \
  > "$OUT/launcher/env.txt" 2>&1
timeout 45 python - >> "$OUT/launcher/env.txt" 2>&1 <<'PY'
import subprocess, time
from kernelforge_tui.cast import launcher
started = time.perf_counter()
why = launcher.load_library()
print(f"build: {why or 'loaded'} in {time.perf_counter() - started:.1f} s at {launcher.build_dir()}")
if why:
    where = launcher.build_dir()
    print(subprocess.run(["ninja", "-C", str(where), "-v"], capture_output=True, text=True).stdout[-6000:])
PY
timeout 75 python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_cast_launcher.py \
  "tests/gpu/test_cast.py::test_the_softmax_kernel_runs_on_torch_tensors_on_the_current_stream" \
  "tests/gpu/test_cast.py::test_both_driver_launch_functions_run_the_kernel" \
  "tests/gpu/test_cast.py::test_threads_launch_at_once_each_with_its_own_argument_block" \
  > "$OUT/launcher/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/launcher/pytest.log"
