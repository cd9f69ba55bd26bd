//@ The persistent kernel's cluster reduction: each block's part read by the others through distributed shared memory,
//@ between two cluster barriers.
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Block result, then the SPLIT blocks of the cluster merge theirs in rank order (all get the same). The next group
// reduces into the same part: a second barrier keeps it until every block has read it.
// A reduction's exchange: the block's part, which the cluster's blocks read.
template <typename S>
using Exchange = S;
template <typename S>
__device__ __forceinline__ S reduce_all(S v, S* red, S* part) {
    v = group_reduce<BLOCK>(v, red);
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
        *part = v;
    }
    cluster.sync();
    v = *cluster.map_shared_rank(part, 0);
#pragma unroll
    for (int r = 1; r < SPLIT; ++r) {
        v = S::combine(v, *cluster.map_shared_rank(part, r));
    }
    cluster.sync();
    return v;
}
