"""A stand-in GPU worker for CI: speaks the real protocol, then misbehaves as a bad kernel would.

FAKE_WORKER_MODE (read per request, so a test can change it between requests through a file named by
FAKE_WORKER_MODE_FILE, or once through the environment):
ok (answers every request), hang (a child process and itself spin forever), die (prints a CUDA-like
error to stderr and exits), garbage (answers a line that is not a reply), refuse_card (answers
load_card with a failure, everything else as ok).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kernelforge_tui.gpu.protocol import (
    CardLoaded,
    LoadCard,
    MeasureCeilings,
    ReplyEnvelope,
    RequestEnvelope,
    WorkerFailure,
)
from kernelforge_tui.vocabulary.evaluation import Ceilings, EvalResult


def _mode() -> str:
    path = os.environ.get("FAKE_WORKER_MODE_FILE")
    if path and Path(path).exists():
        return Path(path).read_text().strip()
    return os.environ.get("FAKE_WORKER_MODE", "ok")


def _answer(request: object, mode: str) -> ReplyEnvelope:
    if isinstance(request, LoadCard):
        if mode == "refuse_card":
            return ReplyEnvelope(reply=WorkerFailure(error="MemoryError: the card needs 9 GB"), kind="failure")
        return ReplyEnvelope(reply=CardLoaded(sets=["set_1", "fresh-0"], device_bytes=1, seconds=0.0), kind="card")
    if isinstance(request, MeasureCeilings):
        ceilings = Ceilings(gpu_name="Fake GPU", copy_gbps=4000.0, fma_tflops=60.0, capability=(9, 0), sm_count=132,
                            l2_bytes=60 << 20, shared_per_sm_bytes=233472, shared_per_block_bytes=232448,
                            registers_per_sm=65536, threads_per_sm=2048)  # fmt: skip
        return ReplyEnvelope(reply=ceilings, kind="ceilings")
    return ReplyEnvelope(reply=EvalResult(ok=True, gpu_seconds=0.01), kind="eval")


def main() -> None:
    for line in sys.stdin:
        request = RequestEnvelope.model_validate_json(line).request
        mode = _mode()
        if mode == "hang":
            child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            with open(os.environ["FAKE_WORKER_PIDFILE"], "w") as f:
                f.write(f"{os.getpid()} {child.pid}")
            while True:
                time.sleep(1)
        if mode == "die":
            print("pycuda._driver.LaunchError: an illegal memory access was encountered", file=sys.stderr, flush=True)
            os._exit(3)
        if mode == "garbage":
            print("hello from a confused worker", flush=True)
            continue
        print(_answer(request, mode).model_dump_json(), flush=True)


if __name__ == "__main__":
    main()
