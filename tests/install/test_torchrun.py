"""examples/torchrun/train_and_publish.py under torchrun (python3 -m torch.distributed.run), two
CPU ranks over gloo: rank 0 publishes every few steps, rank 1 subscribes to rank 0's node and
checks that the last version it receives equals its own replica of the model.

--redirects 1 --tee 1: torch 1.13 (Debian's python3-torch) under Python 3.11 fails at start-up
with its default "0" (Std.from_str returns None for it: Python 3.11's Flag iteration skips the
zero member); a non-zero value tees each rank's stdout to the console with a "[defaultN]:"
prefix and to a log file in --log_dir.
"""
import json
import os
import pathlib
import subprocess
import sys

SOURCE = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("VIPER_BINARY_DIR", SOURCE / "build"))


def test_rank0_publishes_and_rank1_receives_its_own_replica(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(BINARY / "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--redirects", "1", "--tee", "1", "--log_dir", str(tmp_path / "logs"), str(SOURCE / "examples" / "torchrun" / "train_and_publish.py"), "--steps", "12", "--publish-every", "4",
           "--check"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rank 0: step 12" in out and "-> version 3" in out, out
    results = [json.loads(line[line.index("{"):]) for line in proc.stdout.splitlines() if '"rank"' in line]
    assert len(results) == 1, out
    assert results[0]["ok"] and results[0]["received_version"] == 3 and results[0]["step"] == 12, results
