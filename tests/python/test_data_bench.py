"""bench/data_bench.py, tiny: it must run end to end (data set, eviction, torch and viper runs in
their own processes, rounds, medians) and print its ratios. It checks structure, never speed.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_data_bench.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def test_data_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "data_bench.py"), "--dir", str(tmp_path / "data"), "--gb", "0.004",
           "--file-kb", "16", "--steps", "4", "--batch", "4", "--workers", "0", "--readers", "2", "--rounds", "1", "--autos", "1",
           "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"data_bench failed\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    stdout = proc.stdout
    assert "physical baseline" in stdout and "target >= 2" in stdout and "target <= 1.10" in stdout, stdout
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["name"] for r in rows) == ["torch workers=0", "viper auto", "viper readers=2"]
    assert all(r["wait_mean_ms"] >= 0 and r["mb_s"] > 0 for r in rows)
