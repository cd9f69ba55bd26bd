"""The `kernelforge` command: search for faster CUDA kernels, proven correct and timed honestly.

Commands: doctor, eval, optimize, runs, tui, open, profile. Exit codes: 0 success, 1 the candidate (or a
check) failed, 2 bad input (card, plan, file, run), 3 no GPU.
"""
