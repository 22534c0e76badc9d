"""The rehearsal stage of the continual-learning demo (examples/cl_demo/run_rehearsal.py), small:
it must show the forgetting the rehearsal buffer prevents, restore the buffer before each task, and
run as a stage of demo.py.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_rehearsal_demo.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(cmd, timeout=300):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_rehearsal_prevents_forgetting(tmp_path):
    out = tmp_path / "r.json"
    small = "--tasks 3 --steps-per-task 60 --train-per-class 200 --test-per-class 100"
    stdout = run([sys.executable, os.path.join(ROOT, "examples", "cl_demo", "demo.py"), "--stages", "rehearsal",
                  "--workdir", str(tmp_path), "--json", str(out), "--rehearsal-args", small])
    runs = json.loads(out.read_text())["stages"]["rehearsal"]["runs"]
    without, with_r = runs["without rehearsal"], runs["with rehearsal"]
    # Both learn the newest task; only the rehearsal run still knows the old ones.
    assert without["new_task"] > 0.8 and with_r["new_task"] > 0.8, stdout
    assert without["old_tasks"] < 0.3, stdout
    assert with_r["old_tasks"] > without["old_tasks"] + 0.4, stdout
    assert with_r["restored_sizes"] == [0, 400, 400], "the buffer is restored from its spill before each new task"
    assert "=== stage rehearsal" in stdout
    assert "with rehearsal" in stdout and "forgetting" in stdout
