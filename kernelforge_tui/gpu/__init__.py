"""Running on the GPU: the worker subprocess that proves and times built kernels, its client and
protocol, GPU detection, timing statistics and Nsight Compute profiling (`ncu/`). Building needs no GPU:
`build/`.
"""
