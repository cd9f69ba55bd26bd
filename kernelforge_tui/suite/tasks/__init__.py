"""The suite's task modules: dense (vectors and matrices), sparse, activations and losses, rows_and_heads (softmax,
norms, attention), numerics (convolution, pooling, stencils, scans, sorting, FFT, integration)."""
