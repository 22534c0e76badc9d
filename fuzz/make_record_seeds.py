#!/usr/bin/python3
"""Writes the seed corpus of record_fuzz: valid record files (plain, labelled, with a rehearsal
state in the metadata) and near-valid ones.

usage: fuzz/make_record_seeds.py [OUT_DIR]   (default fuzz/corpus/record)

The seeds are committed; rerun this only to change them. Checksums are xxh3-64 through ctypes from
libxxhash, as the C++ side computes them, so the fuzzer starts from files that read back.
"""
import ctypes
import os
import struct
import sys

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return _xxh.XXH3_64bits(b, len(b))


def record_file(records, metadata=b""):
    """records: list of (bytes, label). The layout of include/viper/record_file.h."""
    data = b"".join(r for r, _ in records)
    index, offset = b"", 64
    for r, label in records:
        index += struct.pack("<QQqQ", offset, len(r), label, xxh3(r))
        offset += len(r)
    meta_offset = 64 + len(data)
    tail = metadata + index
    head = b"VIPERREC" + struct.pack("<IIQQQQQ", 1, 64, len(records), meta_offset, len(metadata),
                                     meta_offset + len(metadata), xxh3(tail))
    return head + struct.pack("<Q", xxh3(head)) + data + tail


def rehearsal_state(policy, capacity, seen, sample_bytes, classes):
    out = b"VRHS" + struct.pack("<IIIQQQQ", 1, policy, 0, capacity, seen, sample_bytes, len(classes))
    for label, n in classes:
        out += struct.pack("<qQ", label, n)
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "record")
    os.makedirs(out, exist_ok=True)
    samples = [(bytes([i]) * (i * 7 % 40), i % 3) for i in range(6)]
    spill = [(struct.pack("<Q", i), i % 2) for i in range(4)]
    seeds = {
        "empty.vrec": record_file([]),
        "labelled.vrec": record_file(samples),
        "unlabelled_meta.vrec": record_file([(b"abc", -1), (b"", -1), (b"defgh", -1)], b"user metadata"),
        "rehearsal_spill.vrec": record_file(spill, rehearsal_state(1, 8, 10, 8, [(0, 6), (1, 4)])),
        "rehearsal_reservoir.vrec": record_file(spill, rehearsal_state(0, 4, 30, 0, [(0, 15), (1, 15)])),
        "near_truncated.vrec": record_file(samples)[:-3],
        "near_bad_record.vrec": record_file(samples).replace(bytes([2]) * 14, bytes([9]) * 14, 1),
        "state_only.bin": rehearsal_state(1, 8, 3, 8, [(0, 1), (2, 2)]),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
