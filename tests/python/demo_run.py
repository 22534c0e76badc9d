"""The small, fast run of the continual-learning demo (examples/cl_demo/run_demo.py) that the demo
tests share: a 2 MB model for 6 s, a version every 0.5 s, requests every 0.05 s."""
import json
import os
import subprocess
import sys

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
RUN_DEMO = os.path.join(EXAMPLES, "cl_demo", "run_demo.py")


def run_small_demo(work, transports, *extra):
    """Runs the demo in `work` with `transports` (e.g. "none,file") and `extra` flags; returns
    (results JSON, stdout). Fails the test with the demo's output if it exits non-zero."""
    out = work / "results.json"
    cmd = [sys.executable, RUN_DEMO, "--model-mb", "2", "--duration", "6", "--period", "16",
           "--transports", transports, *extra, "--publish-every-s", "0.5", "--poll-interval", "0.5",
           "--request-interval", "0.05", "--pretrain-iters", "40", "--workdir", str(work), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"run_demo failed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    with open(out, encoding="utf-8") as f:
        return json.load(f), proc.stdout
