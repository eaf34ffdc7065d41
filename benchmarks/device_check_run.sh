#!/usr/bin/env bash
# The GPU check as one launch on a lent GPU machine: each section of device_check.py in its own
# process under its own time limit (a stalled section cannot take the others' time), results
# in OUTDIR: <section>.json and <section>.log per section, nvidia-smi's view of the device.
#
#   bash benchmarks/device_check_run.sh OUTDIR          # from the repository root, on the GPU
#
# The machine's own python3 and torch run this repository from PYTHONPATH; wheels in .whl/
# (LightGBM, for the cost model; nvidia-ml-py, for NVML) are installed to /tmp/site first.
# Limits (seconds) come from NVML_S, PACKED_S, KERNEL_S, PIPELINE_S (defaults 30, 170, 60, 60:
# under 5.5 minutes in all); PYTHON picks
# the interpreter (default python3). Exit 1 when any section failed or ran out of time; each
# section's JSON keeps what it measured.
set -u
out=${1:?usage: device_check_run.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi -q -d TEMPERATURE,CLOCK,POWER >"$out/nvidia-smi.txt" 2>&1
status=0
for pair in "nvml ${NVML_S:-30}" "packed ${PACKED_S:-170}" "kernel ${KERNEL_S:-60}" "pipeline ${PIPELINE_S:-60}"; do
  set -- $pair
  echo "== section $1 (limit $2 s)"
  timeout "$2" "$py" benchmarks/device_check.py --sections "$1" --out "$out/$1.json" \
    >"$out/$1.log" 2>&1
  rc=$?
  grep -v '^USDT' "$out/$1.log" | tail -40
  if [ "$rc" -ne 0 ]; then
    echo "section $1: exit $rc$([ "$rc" -eq 124 ] && echo ' (time limit)')"
    status=1
  fi
done
exit $status
