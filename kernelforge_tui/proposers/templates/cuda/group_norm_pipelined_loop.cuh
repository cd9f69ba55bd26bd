//@ The pipelined strategy's loop head: persistent clusters, each group's slice copied in while the previous one is
//@ normalised; the frame (group_norm.cu) closes the loop.
// Persistent clusters: cluster k normalises groups k, k + clusters, ...; while it works on one,
// the copies of its next group's slice are in flight into the other buffer, so reads and writes overlap.
const int kept_chunks = (int)(hi - lo);
const int first = (int)lo * VEC;
const long long clusters = gridDim.x / SPLIT;
const long long total = (long long)n * groups;
long long gid = blockIdx.x / SPLIT;
int cur = 0;
if (gid < total) { load_slice(kept_buf, x + gid * len, lo, kept_chunks); }
__pipeline_commit();
for (; gid < total; gid += clusters, cur ^= 1) {
VecT* __restrict__ kept = kept_buf + cur * SLICE;
if (gid + clusters < total) { load_slice(kept_buf + (cur ^ 1) * SLICE, x + (gid + clusters) * len, lo, kept_chunks); }
__pipeline_commit();
__pipeline_wait_prior(1);  // this group's copies are done; the next group's may still be in flight
