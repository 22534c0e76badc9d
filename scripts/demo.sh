#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the continual-learning
# demo end to end (examples/cl_demo, docs/DEMO.md), stage by stage:
#   transports  one producer trains an NT3-like PyTorch model (300 MiB) on a drifting stream, one
#               consumer serves requests with the freshest version; once with the baseline users
#               have today (torch.save + directory polling + torch.load), once with Viper;
#   policies    the same training (25 MiB, 8 classes, from scratch) under three checkpoint
#               policies: epoch, fixed interval, and the Inference Performance Predictor online;
#               predicted and measured CIL, and a plot of served loss over time;
#   rehearsal   new classes arrive as a stream of record files read by viper.data's prefetcher;
#               the same training with and without a rehearsal buffer: the forgetting it prevents.
#   neardata    storage hosts (network namespaces; root) relabel their shards when a new version
#               comes and extract features for fine-tuning: the bytes moved beside the baseline's
#               (raw samples to the compute host); about 20 s.
# About 2.5 minutes on 2 cores after the build on a quiet machine, 3 on a loaded one.
#
#   scripts/demo.sh [demo.py options]    e.g. --stages policies --workdir /tmp/d --json out.json
#                                         --transports-args "--model-mb 600 --duration 30"
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then  # help without installing or building
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  echo "demo.py's options: /usr/bin/python3 examples/cl_demo/demo.py --help (after a build)"
  exit 0
fi
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec /usr/bin/python3 "$root/examples/cl_demo/demo.py" "$@"
