//@ Suite task stencil_3d's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per point (32x8 blocks, a z plane per grid layer): interior points take the mean of their 6
// neighbours (fp32), boundary points (fixed: Dirichlet) copy u as T.
extern "C" __global__ void stencil_3d_naive(const T* u, T* v, int nz, int ny, int nx) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    const int z = blockIdx.z;
    if (x >= nx || y >= ny || z >= nz) {
        return;
    }
    const long long plane = (long long)ny * nx;
    const long long at = z * plane + (long long)y * nx + x;
    if (x == 0 || y == 0 || z == 0 || x == nx - 1 || y == ny - 1 || z == nz - 1) {
        v[at] = u[at];
        return;
    }
    const float sum = ld(u, at - plane) + ld(u, at + plane) + ld(u, at - nx) + ld(u, at + nx) + ld(u, at - 1)
                      + ld(u, at + 1);
    v[at] = cv(sum * (1.0f / 6.0f));
}
