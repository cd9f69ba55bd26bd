#!/usr/bin/env bash
# The GPU checks this code still owes the H200 (written while no device was lent): run on the device tool's
# machine from the repo root, carrying .device-wheels (../shared/device/prepare.sh), .whl (the nvidia-cutlass
# wheel) and what a part names (tma.sh: out/gemm_tma_cubins). Each part is capped; its log lands in $OUT/<part>/.
#   bash scripts/h200_checks/run.sh launcher:110 host:150 tma:260 epilogue:420 conv:260 chains:145 cards:80 audit:110 suite:200 bench:600
#   or side by side where parts time nothing: bash run.sh; bash run.sh chains:145 & bash run.sh suite:200 & wait
# Each part's log lands in OUT/parts.tar, one file for all of them (unpack: tar xf parts.tar).
# One call is at most 600 s: split the parts over calls. Parts: the files beside this one.
# installed once per machine, so that parts may run side by side: run.sh with no parts, then several run.sh at once
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .device-wheels/*.whl .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m kernelforge_tui.cli "$@"\n' >/tmp/bin/kernelforge
printf '#!/bin/sh\nexec python3 "$@"\n' >/tmp/bin/python  # a script: a link to a venv's python finds no venv
chmod +x /tmp/bin/kernelforge /tmp/bin/python && export PATH=/tmp/bin:$PATH
here=$(dirname "$0")
start=$(date +%s)
for part in "$@"; do
  name=${part%%:*}; cap=${part#*:}; [ "$cap" = "$part" ] && cap=120
  mkdir -p "$OUT/$name"
  echo "=== $name (cap ${cap}s) at $(( $(date +%s) - start ))s"
  timeout -k 5 "$cap" bash "$here/$name.sh" >"$OUT/$name/log.txt" 2>&1
  echo "rc=$? after $(( $(date +%s) - start ))s"; tail -n 5 "$OUT/$name/log.txt"
  # every part into one OUT/parts.tar (the device returns at most 8 files a call), side-by-side runs taking turns
  flock /tmp/h200_checks.lock tar rf "$OUT/parts.tar" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
done
