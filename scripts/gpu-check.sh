#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and driver but none of this project's Debian
# libraries: programs built elsewhere and packed with their libraries by scripts/gpu-pack.sh
# (PACK/run, PACK/bin/{viper,viper-bench,viper_gpu_peer,gpu_test}), plus bench/gpu_torch_baseline.py.
#
#   scripts/gpu-check.sh PACK [TORCH_SCRIPT]     figures and the full log go to $OUT (default ./gpu-check-out)
# TORCH_SCRIPT defaults to PACK/gpu_torch_baseline.py, else the one beside this script.
#
# Runs every step even when one fails (CUDA IPC can be refused in a sandbox), prints what worked and
# what did not, and exits non-zero if any step failed. Steps: the machine (nvidia-smi, kernel,
# torch), gpu_test (VIPER_FAIL_ON_SKIP=1: no GPU is a failure here), `viper bench --gpu` (JSON to
# $OUT/gpu-bench.json), the torch.save + polling + torch.load baseline ($OUT/torch-baseline.json);
# gpu_test's through-the-node lines (GPU-NODE, GPU-NODE-EARLY, GPU-EARLY, and GPU-DRAFT: zero-copy
# BeginDevice/CommitDevice; GPU-STAGED: the staged path to network readers) are repeated at the end and in $OUT/gpu-node.txt.
# The Python cases: PACK/gpu-python-build.sh builds the viper package for this machine's python3
# from PACK/python into PACK/python-site (OUT keeps only the log and the figures) (GPU_CHECK_PYTHON=DIR uses a package built already; GPU_CHECK_PYTHON=0 skips both Python steps), then
# PACK/gpu_cases.py runs (Publisher.publish and begin_cuda of CUDA tensors, GPU subscribers'
# load_into) with VIPER_FAIL_ON_SKIP=1: without a GPU that is a failure, not a skip.
# Sizes: GPU_CHECK_SIZES (default 1.7G,8G); reps: GPU_CHECK_REPS (default 5), torch reps
# GPU_CHECK_TORCH_REPS (default 2; 0 skips the torch baseline); GPU_CHECK_BENCH=0 skips the bench;
# GPU_CHECK_TEST_LIMIT: gpu_test's time limit in seconds (default 180); GPU_CHECK_BENCH_LIMIT: the
# bench's (default 240: 8 GB pins two 8 GB host twins, about 0.7 s per GiB on that machine).
# GPU_CHECK_HOSTS=SIZES also runs `viper bench --hosts 2` at those sizes (two network namespaces made
# by PACK/hosts.sh; needs root and `ip netns`; JSON to $OUT/hosts-bench.json): the host-to-host
# figures on a machine whose CPUs do not limit them (the VM that builds this project has two).
set -uo pipefail
pack=${1:?usage: gpu-check.sh PACK [TORCH_SCRIPT]}
pack=$(cd "$pack" && pwd)
torch_script=${2:-$pack/gpu_torch_baseline.py}
[ -e "$torch_script" ] || torch_script=$(dirname "$0")/../bench/gpu_torch_baseline.py
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
log=$OUT/gpu-check.log
sizes=${GPU_CHECK_SIZES:-1.7G,8G}
reps=${GPU_CHECK_REPS:-5}
treps=${GPU_CHECK_TORCH_REPS:-2}
declare -a summary
failed=0

step() {  # step NAME TIMEOUT CMD...: runs, logs, records the outcome
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then summary+=("ok      $name (${took}s)")
  else summary+=("FAILED  $name (exit $rc, ${took}s)"); failed=1; fi
  echo "=== $name: exit $rc after ${took}s" | tee -a "$log"
  return "$rc"
}

: >"$log"
echo "gpu-check: $(date -u +%FT%TZ) on $(hostname)" | tee -a "$log"
step "machine: nvidia-smi" 30 nvidia-smi
step "machine: kernel" 5 uname -a
step "machine: torch" 60 python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
step "gpu_test" ${GPU_CHECK_TEST_LIMIT:-180} env VIPER_FAIL_ON_SKIP=1 VIPER_GPU_PEER="$pack/bin/viper_gpu_peer" \
  VIPER_GPU_SUBSCRIBER="$pack/bin/viper_gpu_subscriber" "$pack/run" gpu_test
[ -x "$pack/bin/gpu_node_test" ] && step "gpu_node_test (no-driver path)" 60 env VIPER_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$pack/run" gpu_node_test
# The figures first: where device time runs short, they matter most.
[ "${GPU_CHECK_BENCH:-1}" = 1 ] && \
step "viper bench --gpu" ${GPU_CHECK_BENCH_LIMIT:-240} "$pack/run" viper bench --gpu --sizes "$sizes" --reps "$reps" --json "$OUT/gpu-bench.json"
[ -n "${GPU_CHECK_HOSTS:-}" ] && \
step "viper bench --hosts 2" 150 "$pack/run" viper bench --hosts 2 --sizes "$GPU_CHECK_HOSTS" --reps "$reps" \
  --hosts-script "$pack/hosts.sh" --file-dir /var/tmp --json "$OUT/hosts-bench.json"
[ "$treps" -gt 0 ] && step "torch.save + poll + torch.load baseline" 150 env PYTHONUNBUFFERED=1 python3 "$torch_script" --sizes "$sizes" --reps "$treps" --json "$OUT/torch-baseline.json"
# The Python package for this machine's python3, built here from the packed sources unless
# GPU_CHECK_PYTHON names one already built.
if [ -z "${GPU_CHECK_PYTHON:-}" ] && [ -f "$pack/gpu-python-build.sh" ] && [ -d "$pack/python" ]; then
  step "python: build the viper package" 300 bash "$pack/gpu-python-build.sh" "$pack" "$pack/python-site" \
    && GPU_CHECK_PYTHON=$pack/python-site
fi
[ -n "${GPU_CHECK_PYTHON:-}" ] && [ "$GPU_CHECK_PYTHON" != 0 ] && step "python gpu_cases.py" 300 env VIPER_FAIL_ON_SKIP=1 PYTHONPATH="$GPU_CHECK_PYTHON" \
  UCX_MODULE_DIR="$pack/ucx" LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3 "$pack/gpu_cases.py"

echo | tee -a "$log"
# The through-the-node figures gpu_test prints (publish -> live in another process at 1 GiB; early
# = SubscriberOptions::gpu_early, announced when the device copy completes) and the early test's.
grep -E '^(GPU-NODE|GPU-EARLY|GPU-DRAFT|GPU-STAGED)' "$log" | tee "$OUT/gpu-node.txt"
echo "gpu-check summary:" | tee -a "$log"
for line in "${summary[@]}"; do echo "  $line" | tee -a "$log"; done
exit $failed
