"""Nsight Compute on one GPU: `run` runs ncu over `launch` (one launch through the worker's code), `csv_report`
reads its CSV, `hardware` classifies what it measured, `service` is what the search and `kernelforge
profile` call. Which nodes are profiled and when is the engine's (`engine.profile_schedule`).
"""
