//@ The tiled kernels' n rows from r0: their row pointers rp[0..n] and zeroed sums acc[0..n) in shared memory.
    for (int i = threadIdx.x; i <= n; i += BLOCK) {
        rp[i] = row_ptr[r0 + i];
    }
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        acc[i] = 0.0f;  // an empty row's sum
    }
    __syncthreads();
