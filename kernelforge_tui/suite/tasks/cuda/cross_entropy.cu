//@ Suite task cross_entropy's baseline (activations.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

extern "C" __global__ void cross_entropy_naive(const T* logits, const int* targets, T* loss, int n, int classes) {
    // A thread per sample, three passes over its row in fp32: the max, the sum of exp(x - max), then
    // log(sum) + (max - x[target]) (the shift subtracted exactly, not added to the log and taken away again).
    // fmaxf skips NaN, but exp(NaN - max) then makes the sum NaN; a +inf max gives exp(inf - inf) = NaN.
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n) {
        const long long base = (long long)row * classes;
        float top = NEG_INF;
        for (int j = 0; j < classes; ++j) {
            top = fmaxf(top, ld(logits, base + j));
        }
        float sum = 0.0f;
        for (int j = 0; j < classes; ++j) {
            sum += expf(ld(logits, base + j) - top);
        }
        loss[row] = cv(logf(sum) + (top - ld(logits, base + targets[row])));
    }
}
