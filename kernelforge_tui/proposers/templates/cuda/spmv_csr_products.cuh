//@ The tiled kernels' products in shared memory, unless each thread sums only its own (DIRECT).
#if !DIRECT
    __shared__ float prod[SKEW(TILE - 1) + 1];  // a tile's products value * x[col], summed by other threads
#endif
