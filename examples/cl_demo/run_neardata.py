#!/usr/bin/python3
"""Near-data processing (issue 27, docs/DEMO.md "Near data"): storage hosts relabel their own
shards when a new model version comes and extract features for fine-tuning, so that labels,
features and deltas cross the network instead of the samples.

    /usr/bin/python3 examples/cl_demo/run_neardata.py [--stores 2] [--samples 2048] [--json out.json]
    scripts/demo.sh --stages neardata      (the demo's stage; --neardata-args "..." for options)

It runs `python3 -m viper.neardata bench` on network-namespace test hosts (scripts/hosts.sh, so
it needs root): h1 is the compute host, h2.. storage hosts, each holding one shard of a synthetic
image-like data set (3 x 16 x 16 float32 samples, 10 classes) and running a PipeStore
(`python3 -m viper.neardata serve`) and, for the baseline users have today, an HTTP file server.
A new version is published; every store relabels its shard into its SQLite label database; the
compute host does the same from the raw samples it downloads. Then the head is fine-tuned from
the stores' features (FT-DMP, pipelined and not) and, as the baseline, from the raw samples.
Printed: the bytes every host sent, near-data beside the baseline, the accuracies and the Tuner's
busy fraction. Without root it says so and does not run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", type=int, default=2, help="storage hosts [%(default)s]")
    ap.add_argument("--samples", type=int, default=2048, help="samples in all, split among the stores [%(default)s]")
    ap.add_argument("--epochs", type=int, default=1, help="fine-tuning epochs [%(default)s]")
    ap.add_argument("--workdir", default="/tmp/viper-cl-demo", help="[%(default)s]")
    ap.add_argument("--json", default="", help="results file [<workdir>/neardata.json]")
    ap.add_argument("--viper-path", default=None, help="directory to add to PYTHONPATH for `import viper`")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    path = args.json or os.path.join(args.workdir, "neardata.json")
    if os.geteuid() != 0:
        print("neardata: not run: the storage hosts are network namespaces (scripts/hosts.sh), which need root")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"ran": False, "why": "needs root"}, f)
        return 0
    t0 = time.time()
    env = dict(os.environ, VIPER_HOSTS_SCRIPT=os.path.join(ROOT, "scripts", "hosts.sh"))
    if args.viper_path:
        env["PYTHONPATH"] = args.viper_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    work = os.path.join(args.workdir, "run-neardata")
    bench = os.path.join(args.workdir, "neardata-bench.json")
    cmd = ["/usr/bin/python3", "-m", "viper.neardata", "bench", "--stores", str(args.stores), "--samples",
           str(args.samples), "--epochs", str(args.epochs), "--chunks", "4", "--workdir", work, "--json", bench]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout[-4000:] + run.stderr[-4000:], file=sys.stderr)
        return run.returncode
    r = json.loads(open(bench, encoding="utf-8").read())
    (relabel,) = r["relabel"]
    ft = r["finetune"]
    mb = 1e6
    print(f"Near data: {r['samples']} samples ({r['samples'] * r['sample_bytes'] / mb:.1f} MB) on {args.stores} storage "
          f"hosts; bytes every host sent")
    print(f"{'':<42}{'near data':>14}{'baseline':>14}{'ratio':>9}")
    print(f"{'relabel after a new version':<42}{relabel['near_bytes'] / mb:>11.3f} MB{relabel['baseline_bytes'] / mb:>11.3f} MB"
          f"{100 * relabel['bytes_ratio']:>8.2f}%")
    base = ft["baseline"]
    for mode in ("non_pipelined", "pipelined"):
        f = ft[mode]
        print(f"{'fine-tuning, per epoch (' + mode.replace('_', '-') + ')':<42}{f['bytes_per_epoch'] / mb:>11.3f} MB"
              f"{base['bytes_per_epoch'] / mb:>11.3f} MB{100 * f['bytes_per_epoch'] / base['bytes_per_epoch']:>8.2f}%")
    print(f"labels refreshed {relabel['near_seconds']} s after the publish (baseline: download and relabel "
          f"{relabel['baseline_seconds']} s); fine-tuned accuracy {100 * ft['pipelined']['accuracy']:.1f}% near data, "
          f"{100 * base['accuracy']:.1f}% baseline; Tuner busy {100 * ft['pipelined']['busy_fraction']:.0f}% pipelined, "
          f"{100 * ft['non_pipelined']['busy_fraction']:.0f}% not; {time.time() - t0:.1f} s in all")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"ran": True, "args": vars(args), "bench": r, "wall_s": time.time() - t0}, f, indent=1)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
