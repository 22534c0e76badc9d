"""bench/rehearsal_dist_bench.py, tiny: 2 tasks, 10 steps each, 2 ranks, one seed, every arm
(one process, distributed, one buffer in the same data-parallel training, local per rank).
Checks that every arm runs end to end with real rank processes and that its figures are whole
and sane (the distributed arm drew remotely, every rank trained the same steps), never speed or
forgetting.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_rehearsal_dist_bench.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rehearsal_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "rehearsal_dist_bench.py"), "--seeds", "1",
                          "--ranks", "2", "--tasks", "2", "--steps-per-task", "10", "--train-per-class", "64",
                          "--test-per-class", "32", "--capacity", "40", "--json", str(out),
                          "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "distributed x2 - one buffer, one process" in run.stdout, run.stdout
    assert "distributed x2 - one buffer, x2 ranks" in run.stdout, run.stdout
    r = json.loads(out.read_text())
    arms = {(x["mode"], x["world"], x["rank"]) for x in r["runs"]}
    assert arms == {("single", 1, 0)} | {(m, 2, k) for m in ("dist", "replica", "local") for k in (0, 1)}, arms
    for x in r["runs"]:
        assert x["steps"] == 20, x
        assert -1 <= x["forgetting"] <= 1 and 0 <= x["old_tasks"] <= 1, x
        assert x["mix_ms_per_step"] > 0, x
        if x["mode"] == "dist":
            assert 0 < x["remote_share"] < 1 and x["wait_ms_per_step"] >= 0 and x["fetch_failures"] == 0, x
    # Data-parallel ranks hold the same model: rank 1 reports rank 0's accuracies.
    for mode in ("dist", "replica", "local"):
        a, b = (next(x for x in r["runs"] if x["mode"] == mode and x["rank"] == k) for k in (0, 1))
        assert a["matrix"] == b["matrix"], mode
    assert set(r["summary"]) == {"single1", "dist2", "replica2", "local2"}
