"""The multi-scenario benchmark suite (`kernelforge bench`): tasks beyond the usual LLM operators as operator cards."""
