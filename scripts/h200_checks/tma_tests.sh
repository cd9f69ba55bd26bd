# tma_tests: two TMA renders of gemm_sm90 through the product's path (sandboxed build on the device, the worker
# encoding maps per set: seeded, fresh and stress sets, the second run). ~30 s of nvcc each; no timing, so it may
# run beside other parts.
mkdir -p "$OUT/tma_tests"
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm_tma.py > "$OUT/tma_tests/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/tma_tests/pytest.log"
