# costmodel: what splitting an Inductor fusion really costs on the H200, against the pass's estimate
# (cast/fusion_cost.py: 2 x the intermediate's bytes at half the copy ceiling; 2000 GB/s where none was measured). About 40 s of GPU time; run it alone.
mkdir -p "$OUT/costmodel"
python - > "$OUT/costmodel/split_cost.log" 2>&1 <<'PY'
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16


def time_us(fn, *args, rounds=15, per_round=20):
    # back to back (the GPU stays ahead of the host's enqueue), median of the rounds' means
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_round):
            fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / per_round)
    times.sort()
    return times[len(times) // 2]


def case(name, fused, first, then, args, inter_bytes):
    with torch.no_grad():
        f = torch.compile(fused)
        p = torch.compile(first)
        r = torch.compile(then)
        fused_us = time_us(f, *args)
        split_us = time_us(lambda *a: r(p(*a)), *args)
        alone_us = time_us(r, p(*args))
    est = 2 * inter_bytes / (2000 * 1e3)
    at_ceiling = 2 * inter_bytes / (4200 * 1e3)
    print(f"{name}: fused {fused_us:.1f} us, split {split_us:.1f} us (second kernel alone {alone_us:.1f}): "
          f"measured split cost {split_us - fused_us:.1f} us; estimate {est:.1f} us at 2000 GB/s, "
          f"{at_ceiling:.1f} us at 4200 GB/s; intermediate {inter_bytes / 1e6:.1f} MB")


x = torch.randn(2, 16, 1024, 1024, device=dev, dtype=bf)
mask = torch.full((1024, 1024), float("-inf"), device=dev, dtype=bf).triu(1)
case("scale+mask+softmax [2,16,1024,1024] bf16 (producer split)",
     lambda x, m: torch.softmax(x / 8 + m, -1), lambda x, m: x / 8 + m, lambda y: torch.softmax(y, -1),
     (x, mask), x.numel() * 2)
g = torch.randn(4, 512, 64, 64, device=dev, dtype=bf)
w, b = torch.randn(512, device=dev, dtype=bf), torch.randn(512, device=dev, dtype=bf)
case("group_norm+silu [4,512,64,64] bf16 (consumer split)",
     lambda g: F.silu(F.group_norm(g, 32, w, b)), lambda g: F.group_norm(g, 32, w, b), F.silu,
     (g,), g.numel() * 2)
print(torch.cuda.get_device_name(), torch.__version__)
PY
cat "$OUT/costmodel/split_cost.log"
