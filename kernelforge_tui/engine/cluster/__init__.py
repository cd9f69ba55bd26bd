"""Searches on a Dask cluster: builds on any worker, evaluations on workers that own a GPU (the `[cluster]` extra).

`backend` runs on the coordinator (the process that keeps the run store), `remote` on the workers.
"""
