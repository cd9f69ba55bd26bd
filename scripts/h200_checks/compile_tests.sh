# compile_tests: the compile path's GPU tests (tests/gpu/test_cast_compile.py), whose package carries a (made-up)
# saving for the pass to weigh. About 60-90 s; times nothing asserted, so it may run beside other parts.
mkdir -p "$OUT/compile_tests"
python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_cast_compile.py > "$OUT/compile_tests/test_cast_compile.log" 2>&1
tail -n 5 "$OUT/compile_tests/test_cast_compile.log"
