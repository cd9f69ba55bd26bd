"""`--cluster ADDRESS`, as every command that searches takes it (optimize, tui, open --resume, bench)."""

from __future__ import annotations

import argparse


def add_cluster_option(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help=f"{prefix}a Dask scheduler (tcp://host:8786): builds and evaluations on its workers, one per GPU "
        "offering --resources GPU=1; the runs' stores stay here. Default: [cluster] address in the config, else "
        "this machine's GPUs",
    )
