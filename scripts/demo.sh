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
# About 2.5-3 minutes on 2 cores after the build (the first three stages: 2 min 23 s on a quiet machine
# on 2026-11-25 06:30 UTC, 3 min 10 s at load average 6-7 earlier that day).
#
#   scripts/demo.sh [demo.py options]    e.g. --stages policies --workdir /tmp/d --json out.json
#                                         --transports-args "--model-mb 600 --duration 30"
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec /usr/bin/python3 "$root/examples/cl_demo/demo.py" "$@"
