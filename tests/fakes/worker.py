"""A stand-in GPU worker for CI: speaks the real protocol, then misbehaves as a bad kernel would.

FAKE_WORKER_MODE: ok (answers), hang (a child process and itself spin forever), die (prints a CUDA-like
error to stderr and exits), garbage (answers a line that is not a reply).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from kernelforge_tui.gpu.protocol import EvalResult, ReplyEnvelope, RequestEnvelope


def main() -> None:
    mode = os.environ.get("FAKE_WORKER_MODE", "ok")
    for line in sys.stdin:
        RequestEnvelope.model_validate_json(line)
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
        reply = ReplyEnvelope(reply=EvalResult(ok=True, gpu_seconds=0.01), kind="eval")
        print(reply.model_dump_json(), flush=True)


if __name__ == "__main__":
    main()
