//@ A lane group's row: the lane within the group and the row it shares.
const int lane = threadIdx.x % LANES;
const int r = blockIdx.x * RPB + threadIdx.x / LANES;
