#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the continual-learning
# demo end to end (examples/cl_demo, docs/DEMO.md): one producer process trains an NT3-like
# PyTorch model (300 MiB) on a drifting stream, one consumer process serves requests with the
# freshest version; the same training run is done once with the baseline users have today
# (torch.save + directory polling every second + torch.load) and once with Viper (memory path,
# push), and the figures are printed side by side. About 2 minutes on 2 cores.
#
#   scripts/demo.sh [run_demo.py options]    e.g. --model-mb 600 --duration 30 --json out.json
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec /usr/bin/python3 "$root/examples/cl_demo/run_demo.py" --require-viper "$@"
