# attention: the attention_mma template (tensor-core flash forward for captured attention cards, issue 32) against
# torch's SDPA at a Llama layer's, a ViT's and a long causal shape. Not yet run: no device this session.
# Needs its cubins built on the CPU machine first (seconds of nvcc), and carried to the device:
#   python bench/attention_mma.py build out/attention_cubins && rm -rf out/attention_cubins/cache   # 3 cases x 4 seeds
#   run(..., carry=["out/attention_cubins"])
# About 30 s of GPU time: each seed's error against an fp32 attention of the same inputs (beside torch's) and its
# time against torch's, L2 flushed, interleaved.
mkdir -p "$OUT/attention"
timeout 90 python bench/attention_mma.py run out/attention_cubins --out "$OUT/attention" > "$OUT/attention/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/attention/bench.log"
