//@ The tiled kernels' loop: entries [first, last) (of rows rp[0..n]) streamed a tile at a time, the sums of their
//@ rows' entries in that range added to acc.
    const int lane = threadIdx.x & 31;
    Pack<T> v[CHUNKS];
    Pack<int> c[CHUNKS];
    int a = first & ~(VEC - 1);
    load_tile(values, col_idx, a, last, v, c);
    for (; a < last; a += TILE) {  // the same trip count in every thread: rp is shared
        // The products (chunk entries outside the block's rows are never summed), then the next tile's loads,
        // in flight while this one is summed.
#if DIRECT
        float mine[VEC];  // the one chunk this thread loaded is its share
#endif
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m) {
            const int k = threadIdx.x + m * BLOCK;
            if (a + k * VEC < last) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    const float product = to_f(v[m].e[j]) * to_f(GATHER(x + c[m].e[j]));
#if DIRECT
                    mine[j] = product;
#else
                    prod[SKEW(k * VEC + j)] = product;
#endif
                }
            }
        }
        load_tile(values, col_idx, a + TILE, last, v, c);
#if !DIRECT
        __syncthreads();
#endif
        // This thread's share: ITEMS consecutive entries, summed in order. A row ending inside is stored to acc if
        // it also began inside (no other share has any of it), else added.
        const int own = a + threadIdx.x * ITEMS;
        const int lo = max(own, first);
        const int hi = min(own + ITEMS, last);
        int row = 0;
        int end = 0;
        bool alone = false;  // `row` began inside this share
        if (lo < hi) {
            row = row_of(rp, n, lo);
            end = rp[row + 1];
            alone = rp[row] == lo;
        }
        float s = 0.0f;
        bool pending = false;  // s holds entries of `row` not yet in acc
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const int p = own + j;
            if (p >= lo && p < hi) {
#if DIRECT
                s += mine[j];
#else
                s += prod[SKEW(p - a)];
#endif
                pending = true;
                if (p + 1 == end) {
                    if (alone) {
                        acc[row] = s;
                    } else {
                        atomicAdd(&acc[row], s);
                    }
                    s = 0.0f;
                    pending = false;
                    alone = true;
                    do {  // on to the row holding p + 1, past empty rows (which start and end there)
                        ++row;
                    } while (row < n && rp[row + 1] == end);
                    end = row < n ? rp[row + 1] : last;
                }
            }
        }
        // The row still going at the share's end: equal keys are neighbours (shares ascend), so a segmented sum
        // down the warp leaves each run's total in its first lane, which adds it once.
        const int key = pending ? row : -1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float below = __shfl_down_sync(FULL_MASK, s, o);
            const int below_key = __shfl_down_sync(FULL_MASK, key, o);
            if (lane + o < 32 && below_key == key) {
                s += below;
            }
        }
        const int above_key = __shfl_up_sync(FULL_MASK, key, 1);
        if (key >= 0 && (lane == 0 || above_key != key)) {
            atomicAdd(&acc[key], s);
        }
#if !DIRECT
        __syncthreads();  // acc complete for this tile, prod free for the next
#endif
    }
#if DIRECT
    __syncthreads();  // acc complete: no thread reads another's products or sums inside the loop
#endif
