# suite helper (issue 32): GPU checks for the new templates, for a session with an H200. Run from the repo root
# after the wheel install; logs under $OUT/suite/. Not run in this session (no H200).
mkdir -p "$OUT/suite"
# 1. every seed of the six tasks through the worker's checks (seeded, fresh, stress), 2^18, fp32 and bf16 (~2 min)
python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_suite_templates.py > "$OUT/suite/gpu_tests.log" 2>&1
# 2. the six tasks' baselines against the changed stress sets (conv: large skipped)
python bench/suite_baselines.py --tasks conv_1d conv_2d matrix_power high_order_contraction softmax_attention \
  triangle_attention --precision both --out "$OUT/suite/baselines" > "$OUT/suite/baselines.log" 2>&1
# 3. (long: not for a 150 s slot) the full suite score, as results.md's 1.737x row was measured:
# KERNELFORGE_PROFILE__NEW_BEST=false KERNELFORGE_PROFILE__BEATS_PARENT=false kernelforge bench --gpus 2 \
#   --budget-minutes-per-task 1.5 --budget-iters 12 -o DIR
