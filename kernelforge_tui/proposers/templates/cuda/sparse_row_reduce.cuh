//@ The end of a lane-group kernel: the group's partial sums added by xor shuffles, lane 0 writes the row.
// Every lane of the warp gets here (no early return), so full-mask shuffles are safe.
#pragma unroll
for (int o = LANES / 2; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(FULL_MASK, sum, o);
}
if (lane == 0 && r < nrows) {
    y[r] = from_f(sum);
}
}
