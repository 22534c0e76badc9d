#!/usr/bin/python3
"""Writes the seed corpus of protocol_fuzz (fuzz/corpus/protocol/): one valid frame of every
message type, assembled here straight from docs/PROTOCOL.md (independently of the C++ encoder),
so the fuzzer starts from inputs that get past the frame checks.

    /usr/bin/python3 fuzz/make_protocol_seeds.py
"""
import os
import struct

MAGIC = 0x52504956
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "protocol")


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def u8(v): return struct.pack("<B", v)
def u16(v): return struct.pack("<H", v)
def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def i64(v): return struct.pack("<q", v)


def replica(kind, host, loc): return u8(kind) + s(host) + s(loc)


def version_info(model="nt3", version=7, replicas=()):
    meta = {"loss": "0.25", "viper.step": "700"}
    out = s(model) + u64(version) + u64(1 << 20) + u64(0x1234ABCD) + u64(700) + i64(10**18) + i64(10**18 + 5)
    out += u32(len(meta)) + b"".join(s(k) + s(v) for k, v in sorted(meta.items()))
    out += u32(len(replicas)) + b"".join(replica(*r) for r in replicas)
    return out


REPLICAS = [(1, "boot:ns:mnt", "viper.1.2"), (2, "other", "10.0.0.2:7000"), (3, "", "/pfs/nt3/7.safetensors")]
MESSAGES = {
    1: ("hello", s("secret") + s("watch") + s("boot:ns:mnt") + u32(42)),
    2: ("hello_ok", s("node") + s("boot:ns:mnt") + u32(1)),
    3: ("subscribe", s("nt3") + u8(1)),
    4: ("unsubscribe", s("nt3")),
    5: ("notify", version_info(replicas=REPLICAS)),
    6: ("fetch", u64(1) + s("nt3") + u64(0) + u8(2) + u64(1 << 24) + u32(4 << 20) + u64(6) + u64(0x1234ABCD)),
    7: ("fetch_ok", u64(1) + u8(2) + version_info() + s("") + u32(0) + u32(0) + u8(2) + u64(6) + s("delta")),
    8: ("release", s("nt3") + u64(7)),
    9: ("ack", s("nt3") + u64(7)),
    10: ("error", u64(0) + u16(1) + s("malformed message: x")),
    11: ("publish", u64(2) + s("nt3") + u64(1 << 20) + u64(5) + i64(10**18) + u32(4 << 20)),
    12: ("publish_ready", u64(2) + u64(1 << 32)),
    13: ("publish_ok", u64(2) + u64(8)),
    14: ("list", u64(3)),
    15: ("list_reply", u64(3) + u32(2) + version_info(version=6) + version_info(replicas=REPLICAS[:1])),
    16: ("replica", s("nt3") + u64(7) + replica(*REPLICAS[1])),
    17: ("delta_part", u64(1) + u32(0) + u32(4096) + u8(1)),
    18: ("incoming", version_info(replicas=[(4, "relay", "10.0.0.3:7000")] + REPLICAS)),
    19: ("stats", u64(4)),
    20: ("stats_reply", u64(4) + u32(2) + s("bytes_sent") + u64(600 << 20) + s("peers") + u64(3)),
    # The end of a cut-through SEND: the sealed version and its final header (8-byte length + JSON).
    21: ("sealed", u64(1) + version_info(replicas=REPLICAS[:2]) + u32(24) + u64(16) + b'{"__metadata__":{}}'[:16]),
}


# GPU-resident versions: FETCH mode 3 (kDevice), its FETCH_OK (a 128-byte GPU version message as
# the segment) and a NOTIFY listing a kind-5 (device) replica.
GPU_VERSION = b"VGPU" + u32(1) + u64(7) + u64(4096) + u64(256) + u64(1024) + u64(0x1234ABCD) + struct.pack("<i", 0) \
    + u32(1) + u32(42) + u32(0) + bytes(range(64))
EXTRA = {
    "06_fetch_device": (6, u64(5) + s("nt3") + u64(7) + u8(3) + u64(0) + u32(0) + u64(0) + u64(0)),
    "07_fetch_ok_device": (7, u64(5) + u8(3) + version_info() + u32(len(GPU_VERSION)) + GPU_VERSION + u32(0) + u32(0)
                           + u8(1) + u64(0) + s("")),
    # A resumed SEND (FETCH with the optional trailing offset: the transfer continues at byte 12 MiB).
    "06_fetch_resume": (6, u64(6) + s("nt3") + u64(7) + u8(2) + u64(1 << 24) + u32(4 << 20) + u64(0) + u64(0)
                        + u64(12 << 20)),
    "05_notify_device": (5, version_info(replicas=REPLICAS + [(5, "boot:ns:mnt", "cuda:0")])),
    # A SEND of a version still being written (FETCH_OK encoding 3: checksum 0, SEALED follows).
    "07_fetch_ok_sealed_later": (7, u64(1) + u8(2) + version_info() + s("") + u32(4 << 20) + u32(1) + u8(3) + u64(0)
                                 + s("")),
}


def frame(mtype, payload, version=2):
    return u32(MAGIC) + u16(version) + u16(mtype) + u32(len(payload)) + payload


def main():
    os.makedirs(OUT, exist_ok=True)
    for mtype, (name, payload) in MESSAGES.items():
        with open(os.path.join(OUT, f"{mtype:02d}_{name}"), "wb") as f:
            f.write(frame(mtype, payload))
    for name, (mtype, payload) in EXTRA.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(frame(mtype, payload))
    with open(os.path.join(OUT, "99_other_version"), "wb") as f:
        f.write(frame(3, s("nt3"), version=1))
    # A STATS_REPLY with a latency histogram among its counters (docs/PROTOCOL.md, STATS_REPLY):
    # what `viper stats --prometheus` parses from the names.
    hist = [("hist_publish_live_us_le_100", 1), ("hist_publish_live_us_le_2500", 3),
            ("hist_publish_live_us_le_inf", 1), ("hist_publish_live_us_sum", 9000), ("peers", 2)]
    body = u64(5) + u32(len(hist)) + b"".join(s(n) + u64(v) for n, v in sorted(hist))
    with open(os.path.join(OUT, "20_stats_reply_histogram"), "wb") as f:
        f.write(frame(20, body))
    print(f"wrote {len(MESSAGES) + len(EXTRA) + 2} seeds to {OUT}")


if __name__ == "__main__":
    main()
