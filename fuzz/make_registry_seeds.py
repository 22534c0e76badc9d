#!/usr/bin/python3
"""Writes the seed corpus of registry_record_fuzz (fuzz/corpus/registry_record/): valid records as
a node writes them (docs/ARCHITECTURE.md "Registry"), written here independently of the C++
encoder, plus near misses, so the fuzzer starts past the JSON and field checks.

    /usr/bin/python3 fuzz/make_registry_seeds.py
"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "registry_record")


def record(**over):
    host = "2a030eba-c49b-409e-9ae5-8af79476548c:4026531833:4026531832"
    r = {
        "format": 1,
        "node": {"id": "1093ebcb67e753ec", "name": "node-1", "address": "127.0.0.1:7300", "host_key": host, "pid": 42},
        "model": "nt3", "version": 7, "size": 4096, "checksum": "d03d67dac77234b1", "step": 700,
        "publish_ns": 1795558893513559723, "completed_ns": 1795558893675804473,
        "metadata": {"viper.model": "nt3", "viper.version": "7", "user": "line\nbreak"},
        "replicas": [
            {"kind": "segment", "host_key": host, "locator": "viper.13668.1"},
            {"kind": "node", "host_key": host, "locator": "127.0.0.1:7300"},
            {"kind": "file", "host_key": host, "locator": "/pfs/viper/nt3/7.safetensors"},
            {"kind": "relay", "host_key": "", "locator": "[::1]:7301"},
        ],
    }
    r.update(over)
    return json.dumps(r, separators=(",", ":"))


SEEDS = {
    "01_valid": record(),
    "02_no_metadata": record(metadata={}),
    "03_v6_node": record(node={"id": "00000000000000ff", "name": "n", "address": "[::1]:1", "host_key": "h", "pid": 1},
                         replicas=[{"kind": "node", "host_key": "h", "locator": "[::1]:1"}]),
    "04_bad_kind": record(replicas=[{"kind": "disk", "host_key": "", "locator": "x"}]),
    "05_dotdot": record(replicas=[{"kind": "file", "host_key": "", "locator": "/a/../b"}]),
    "06_other_format": record(format=2),
    "07_big_version": record(version=18446744073709551615),
    "08_url": "redis://[::1]:6379/15",
    "09_url_bad": "redis://host:65536/x",
}

os.makedirs(OUT, exist_ok=True)
for name, text in SEEDS.items():
    with open(os.path.join(OUT, name), "w") as f:
        f.write(text)
print(f"wrote {len(SEEDS)} seeds to {OUT}")
