//@ Suite task stencil_2d's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per point on 32x8 blocks: interior points take the mean of their 4 neighbours (fp32), boundary points
// (fixed: Dirichlet) copy u as T.
extern "C" __global__ void stencil_2d_naive(const T* u, T* v, int ny, int nx) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= nx || y >= ny) {
        return;
    }
    const long long at = (long long)y * nx + x;
    if (x == 0 || y == 0 || x == nx - 1 || y == ny - 1) {
        v[at] = u[at];
        return;
    }
    v[at] = cv(0.25f * (ld(u, at - nx) + ld(u, at + nx) + ld(u, at - 1) + ld(u, at + 1)));
}
