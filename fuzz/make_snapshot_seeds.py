#!/usr/bin/python3
"""Writes the seed corpus of snapshot_fuzz: valid and near-valid safetensors buffers.

usage: fuzz/make_snapshot_seeds.py [OUT_DIR]   (default fuzz/corpus/snapshot)

The seeds are committed; rerun this only to change them. Valid Viper-style seeds carry a real
viper.checksum (xxh3-64 through ctypes from libxxhash, as the C++ side uses), so the fuzzer
starts from inputs that pass verify_checksum too.
"""
import ctypes
import json
import os
import struct
import sys

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def frame(header_text, data=b"", pad=True):
    raw = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    if pad:
        raw += b" " * ((8 - (8 + len(raw)) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def viper(tensors, alignment=64, meta=None, checksum=True):
    """tensors: [(name, dtype, shape)]; returns a Viper-style buffer with padding and checksum."""
    header, data = {}, b""
    for i, (name, dtype, shape) in enumerate(tensors):
        begin = (len(data) + alignment - 1) // alignment * alignment
        data += b"\0" * (begin - len(data))
        n = SIZES[dtype]
        for d in shape:
            n *= d
        data += bytes((i * 37 + k * 11) & 0xff for k in range(n))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, len(data)]}
    m = dict(meta or {})
    m.update({"viper.model": "seed", "viper.version": "3", "viper.step": "30", "viper.time_ns": "1",
              "viper.loss": "0.25", "viper.alignment": str(alignment)})
    if checksum:
        m["viper.checksum"] = "%016x" % _xxh.XXH3_64bits(data, len(data))
    return frame(json.dumps(dict(__metadata__=m, **header), separators=(",", ":")), data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def seeds():
    yield "viper_a64", viper([("w", "F32", [2, 3]), ("b", "U8", [5]), ("s", "BF16", [])])
    yield "viper_a1_all_dtypes", viper([(d.lower(), d, [2]) for d in SIZES], alignment=1)
    yield "viper_empty_and_scalar", viper([("e", "F32", [0]), ("s", "F64", []), ("z", "I16", [3, 0])])
    yield "viper_no_tensors", viper([], meta={"note": "only metadata"})
    yield "viper_a4096", viper([("a", "U8", [3]), ("b", "U8", [2])], alignment=4096)
    hf = '{"b":%s,"a":%s}' % (json.dumps(entry("F32", [2], 8, 16)), json.dumps(entry("I16", [2, 2], 0, 8)))
    yield "hf_unpadded", frame(hf + "   ", bytes(range(16)), pad=False)
    yield "minimal_empty", frame("{}")
    # Near-valid: one fault each.
    good = viper([("w", "F32", [4])])
    bad = bytearray(good)
    bad[-1] ^= 1
    yield "near_checksum_mismatch", bytes(bad)
    yield "near_truncated", good[:-3]
    yield "near_header_len_lies", struct.pack("<Q", 4096) + good[8:]
    yield "near_gap", frame(json.dumps({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 8, 10)}), bytes(10))
    yield "near_overlap", frame(json.dumps({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}), bytes(6))
    yield "near_trailing", frame(json.dumps({"a": entry("U8", [4], 0, 4)}), bytes(5))
    yield "near_bad_dtype", frame(json.dumps({"a": entry("C64", [1], 0, 8)}), bytes(8))
    yield "near_duplicate", frame('{"a":%s,"a":%s}' % ((json.dumps(entry("U8", [1], 0, 1)),) * 2), bytes(1))
    yield "near_negative_dim", frame(json.dumps({"a": entry("U8", [-1], 0, 1)}), bytes(1))
    yield "near_huge_shape", frame(json.dumps({"a": entry("F64", [2 ** 62, 4], 0, 8)}), bytes(8))
    yield "near_float_offset", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', bytes(1))
    yield "near_extra_field", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}}', bytes(1))
    yield "near_bad_alignment", frame('{"__metadata__":{"viper.alignment":"48"}}')
    yield "near_bad_checksum_hex", frame('{"__metadata__":{"viper.checksum":"12g4"}}')
    yield "near_metadata_number", frame('{"__metadata__":{"k":1}}')
    yield "near_invalid_utf8", frame(b'{"\xc3\x28":{}}')
    yield "near_nested", frame('{"__metadata__":{"k":[[[[{"a":[]}]]]]}}')


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "snapshot")
    os.makedirs(out, exist_ok=True)
    for name, blob in seeds():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(blob)
    print("wrote seeds to %s" % out)


if __name__ == "__main__":
    main()
