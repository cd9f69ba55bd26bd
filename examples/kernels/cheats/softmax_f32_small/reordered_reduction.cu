// NOT A CHEAT (control) reordered_reduction: a correct fp32 softmax whose sums run in another order than
// the reference's (each thread walks its elements backwards, then a shared-memory tree) with accurate
// expf.
// expect: pass -- fp32 tolerance must be loose enough for a reordered reduction.
extern "C" __global__ void reordered_reduction_f32(const float* x, float* y, int rows, int cols) {
    __shared__ float buf[1024];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    const int tid = threadIdx.x;
    const int last = tid + ((cols - 1 - tid) / (int)blockDim.x) * (int)blockDim.x;  // this thread's last index
    float m = __int_as_float(0xff800000);
    for (int i = last; i >= 0 && i < cols; i -= blockDim.x) {
        m = fmaxf(m, xr[i]);
    }
    buf[tid] = m;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {  // blockDim.x a power of two
        if (tid < half) {
            buf[tid] = fmaxf(buf[tid], buf[tid + half]);
        }
        __syncthreads();
    }
    m = buf[0];
    __syncthreads();
    float s = 0.0f;
    for (int i = last; i >= 0 && i < cols; i -= blockDim.x) {
        s += expf(xr[i] - m);
    }
    buf[tid] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (tid < half) {
            buf[tid] += buf[tid + half];
        }
        __syncthreads();
    }
    s = buf[0];
    for (int i = tid; i < cols; i += blockDim.x) {
        yr[i] = expf(xr[i] - m) / s;
    }
}
