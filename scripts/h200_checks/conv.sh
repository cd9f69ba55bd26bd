# conv: the convolution templates against cuDNN (issue 32's goal: 90% of cuDNN at the diffusion block's 3x3),
# conv_sm90 (wgmma, TMA boxes of the input; never run yet) and conv_igemm (CUTLASS 2.x), channels-last bf16, each
# configuration in its own process (each_config.sh: conv_sm90's maps reach CUTLASS as the TMA GEMM's, which faulted).
# Needs out/conv_cubins, built here: python bench/conv_cutlass.py build out/conv_cubins && rm -rf out/conv_cubins/cache
# (11 configurations, 6 of conv_sm90, each over the cases it serves: about 3-4 min of GPU time).
mkdir -p "$OUT/conv"
bash "$(dirname "$0")/each_config.sh" bench/conv_cutlass.py conv_cubins "$OUT/conv"
