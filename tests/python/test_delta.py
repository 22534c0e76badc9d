"""Deltas from Python: nothing changes for the user (wait_for and load_into just receive less);
PublishResult.wait_delta() and ModelVersion.delta_base / wire_bytes say what happened.

Run: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest tests/python/test_delta.py
"""
import numpy as np
import torch

import viper


def test_versions_arrive_as_deltas_and_load_into_a_module():
    pub = viper.Publisher("dm", listen="127.0.0.1:0", mode="sync", delta="always")
    sub = viper.Subscriber("dm", connect=pub.address, path="remote")  # the network path even on one host
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 64)).to(torch.bfloat16)
        first = pub.publish(model.state_dict(), step=1)
        assert first.wait_delta()["prepared"] is False  # nothing to make it against
        sub.wait_for(first.version, timeout=30)
        for step in range(2, 5):
            with torch.no_grad():
                w = model[0].weight.view(-1)
                w[::100] += 1.0  # about 1% of one tensor's elements change
            result = pub.publish(model.state_dict(), step=step)
            version = sub.wait_for(result.version, timeout=30)
            assert version.delta_base == result.version - 1, version.reason
            assert 0 < version.wire_bytes < result.bytes // 10
            delta = result.wait_delta(timeout=30)
            assert delta["prepared"] and delta["base_version"] == result.version - 1
            assert 0 < delta["bytes"] < result.bytes // 10 and delta["snapshot_bytes"] == result.bytes
            assert 0 < delta["encode_seconds"] < 30
            fresh = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 64)).to(torch.bfloat16)
            sub.load_into(fresh)
            for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
                assert torch.equal(a.view(torch.int16), b.view(torch.int16))  # bit for bit
        stats = sub.stats()
        assert stats["deltas"] == 3 and stats["delta_fallbacks"] == 0
    finally:
        sub.close()
        pub.close()


def test_deltas_off_sends_full_snapshots():
    pub = viper.Publisher("dm2", listen="127.0.0.1:0", mode="sync", delta="off")
    sub = viper.Subscriber("dm2", connect=pub.address, path="remote")
    try:
        arrays = {"w": np.arange(100000, dtype=np.float32)}
        sub.wait_for(pub.publish(arrays).version, timeout=30)  # live first: the next fetch offers it as a base
        arrays["w"][::50] += 1
        result = pub.publish(arrays)
        version = sub.wait_for(result.version, timeout=30)
        assert version.delta_base == 0 and version.wire_bytes == result.bytes
        assert "deltas are off" in version.reason
        assert result.wait_delta()["why_not"] == "deltas are off on this node"
        np.testing.assert_array_equal(version["w"], arrays["w"])
    finally:
        sub.close()
        pub.close()
