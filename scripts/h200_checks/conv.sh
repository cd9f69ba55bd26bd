# conv: the conv_igemm template (CUTLASS 2.x implicit-GEMM fprop, channels-last bf16) against cuDNN (issue 32's
# goal: the diffusion block's 3x3 convolution at 90% of cuDNN or better). Not yet run: no device this session.
# Needs its cubins built on the CPU machine first (~1 min of nvcc on 2 cores), and carried to the device:
#   python bench/conv_cutlass.py build out/conv_cubins && rm -rf out/conv_cubins/cache   # 7 cases x 5 seeds
#   run(..., carry=["out/conv_cubins"])
# About 40-60 s of GPU time: each seed's error against an fp32 convolution of the same inputs (beside cuDNN's) and
# its time against cuDNN (cudnn.benchmark; channels-last, and NCHW for the diffusion case), L2 flushed, interleaved.
mkdir -p "$OUT/conv"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/conv/env.txt" 2>&1
timeout 110 python bench/conv_cutlass.py run out/conv_cubins --out "$OUT/conv" > "$OUT/conv/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/conv/bench.log"
