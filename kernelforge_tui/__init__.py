"""Kernel Forge TUI: search for faster CUDA kernels, proven correct and timed honestly."""

__version__ = "0.1.0"
