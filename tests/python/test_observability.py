"""Observability from Python: Node.stats() and Publisher.stats() (counters and latency histograms,
as `viper stats` shows them), viper.set_log_level() and the log line's format.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_observability.py
"""
import math
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import viper

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z viper\[(\d+)/(\d+)\] (error|warn|info|debug) [a-z_]+: .+$")


def check_histogram(h):
    buckets = h["buckets"]
    assert len(buckets) == 20
    bounds = [b for b, _ in buckets]
    counts = [c for _, c in buckets]
    assert bounds == sorted(bounds) and math.isinf(bounds[-1])
    assert bounds[0] == pytest.approx(0.0001) and bounds[-2] == pytest.approx(100.0)
    assert counts == sorted(counts), "cumulative"
    assert counts[-1] == h["count"]
    assert h["sum_seconds"] >= 0


def test_publisher_and_node_stats():
    tensors = {"w": np.arange(64 * 1024, dtype=np.float32)}
    with viper.Publisher("obs", listen="127.0.0.1:0", mode="sync") as pub:
        with viper.Subscriber("obs", connect=pub.address, path="remote") as sub:
            pub.publish(tensors, step=0)
            sub.wait_for(1, timeout=30)  # subscribed: the next two are notified
            for step in (1, 2):
                pub.publish(tensors, step=step)
            sub.wait_for(3, timeout=30)
            # The node counts a SEND when its last chunk's send completes, which may follow the
            # subscriber's receipt by a moment.
            deadline = time.monotonic() + 10
            while pub.stats()["histograms"]["fetch_send"]["count"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            s = pub.stats()
        assert s["versions_committed"] == 3
        assert s["announced_version"] == 3
        assert s["last_stall_seconds"] >= 0
        assert s["notifies_sent"] >= 2
        assert s["peers"] == 1
        assert s["bytes_sent"] >= tensors["w"].nbytes  # the subscriber fetched over the network
        assert set(s["histograms"]) == {"publish_live", "fetch_send"}
        for h in s["histograms"].values():
            check_histogram(h)
        assert s["histograms"]["publish_live"]["count"] == 3
        assert s["histograms"]["publish_live"]["sum_seconds"] > 0
        assert s["histograms"]["fetch_send"]["count"] >= 1  # path="remote": SEND transfers
        assert not any(k.startswith("hist_") for k in s)

    with viper.Node(listen="127.0.0.1:0") as node:
        with viper.Subscriber("obs", connect=node.address):
            s = node.stats()
            assert s["peers"] == 1
            assert s["versions_committed"] == 0
            for name in ("host_free_segments", "bytes_sent", "malformed_messages", "delta_sent"):
                assert isinstance(s[name], int), name
            for h in s["histograms"].values():
                check_histogram(h)
                assert h["count"] == 0
    with pytest.raises(viper.Error, match="closed"):
        node.stats()


def test_set_log_level_checks_and_reads_back():
    before = viper.log_level()
    try:
        for level in ("error", "warn", "info", "debug"):
            viper.set_log_level(level)
            assert viper.log_level() == level
        with pytest.raises(viper.InvalidArgumentError, match=r"level='loud': must be one of error, warn, info, debug"):
            viper.set_log_level("loud")
        with pytest.raises(TypeError, match="expected a str"):
            viper.set_log_level(3)
    finally:
        viper.set_log_level(before)


def node_log(env_level, set_level):
    """stderr of a child that starts a viper.Node under VIPER_LOG=env_level after set_log_level(set_level)."""
    code = textwrap.dedent(f"""
        import viper
        if {set_level!r}:
            viper.set_log_level({set_level!r})
        viper.Node(listen="127.0.0.1:0").close()
    """)
    env = dict(os.environ, VIPER_LOG=env_level)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stderr.splitlines(), r


def test_log_lines_and_set_log_level_wins_over_env():
    lines, _ = node_log("error", "info")
    info = [line for line in lines if " info node: " in line]
    assert info, lines
    for line in lines:
        m = LINE.match(line)
        assert m, line
        assert int(m.group(2)) > 0
    lines, _ = node_log("info", "error")
    assert not [line for line in lines if " info " in line], lines
    lines, _ = node_log("info", "")  # VIPER_LOG alone still works
    assert [line for line in lines if " info node: " in line], lines
