//@ Suite task merge_attn_states's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output element: its (token, head)'s two lse values give m = max, weights exp(lse - m) / their sum;
// the output is the weighted sum of the two partial outputs, and the first thread of the row writes log(sum) + m.
extern "C" __global__ void merge_attn_states_naive(const T* prefix_output, const float* prefix_lse,
                                                   const T* suffix_output, const float* suffix_lse, T* output,
                                                   float* output_lse, long long total, int tokens, int heads, int d) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) {
        return;
    }
    const long long row = i / d;  // token * heads + head
    const long long at = (row % heads) * tokens + row / heads;
    const float pl = prefix_lse[at], sl = suffix_lse[at];
    const float m = fmaxf(pl, sl);
    const float pe = expf(pl - m), se = expf(sl - m);
    const float sum = pe + se;
    output[i] = cv(ld(prefix_output, i) * (pe / sum) + ld(suffix_output, i) * (se / sum));
    if (i % d == 0) {
        output_lse[at] = logf(sum) + m;
    }
}
