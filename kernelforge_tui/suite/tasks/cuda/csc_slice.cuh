//@ The CSC baselines' slice (sparse.py's SLICE). CSC scatters: column c adds values * x[c] into scattered rows. One
//@ launch and a NaN-poisoned y rule out atomics into y, so a block owns SLICE outputs, zeroes them in shared memory,
//@ adds the contributions that land there while its threads walk every column (a thread per column), and writes
//@ them once.
#define SLICE $slice  // fp32 accumulators of a block: 32 KiB of shared memory
