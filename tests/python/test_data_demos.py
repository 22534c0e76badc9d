"""The data side's two commands, small: the rehearsal stage of the continual-learning demo
(examples/cl_demo/run_rehearsal.py) must show the forgetting the buffer prevents, and the data
benchmark (bench/data_bench.py) must run end to end and print its ratios.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_data_demos.py
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
    stdout = run([sys.executable, os.path.join(ROOT, "examples", "cl_demo", "run_rehearsal.py"), "--tasks", "3",
                  "--steps-per-task", "60", "--train-per-class", "200", "--test-per-class", "100",
                  "--workdir", str(tmp_path), "--json", str(out)])
    runs = json.loads(out.read_text())["runs"]
    without, with_r = runs["without rehearsal"], runs["with rehearsal"]
    # Both learn the newest task; only the rehearsal run still knows the old ones.
    assert without["new_task"] > 0.8 and with_r["new_task"] > 0.8, stdout
    assert without["old_tasks"] < 0.3, stdout
    assert with_r["old_tasks"] > without["old_tasks"] + 0.4, stdout
    assert with_r["restored_sizes"] == [0, 400, 400], "the buffer is restored from its spill before each new task"
    assert "with rehearsal" in stdout and "forgetting" in stdout


def test_data_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    stdout = run([sys.executable, os.path.join(ROOT, "bench", "data_bench.py"), "--dir", str(tmp_path / "data"),
                  "--gb", "0.004", "--file-kb", "16", "--steps", "4", "--batch", "4", "--workers", "0",
                  "--readers", "2", "--rounds", "1", "--json", str(out)])
    assert "physical baseline" in stdout and "target >= 2" in stdout and "target <= 1.10" in stdout, stdout
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["name"] for r in rows) == ["torch workers=0", "viper auto", "viper auto'", "viper readers=2"]
    assert all(r["wait_mean_ms"] >= 0 and r["mb_s"] > 0 for r in rows)
