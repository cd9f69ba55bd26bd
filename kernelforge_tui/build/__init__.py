"""Building candidates with nvcc and checking their sources first; none of it needs a GPU.

`nvcc` is the builder (sandboxed nvcc behind a content-hash cache); `source_check` is the one entry point of
the static checks on untrusted source (`token_guard`, `tree_check`, `param_check` over `cuda_tokens` and
`cuda_syntax`, reporting `source_problem`s under `source_policy`); `sandbox` and `sandbox_exec` confine
nvcc; `nvcc_output` and `cubin_check` read what it wrote. Running on the GPU is `gpu/`'s.
"""
