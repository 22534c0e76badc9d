#!/usr/bin/python3
"""An independent reader of safetensors files, from the published format (json + struct only).

usage: check_safetensors.py FILE EXPECT_JSON

EXPECT_JSON: {"alignment": A, "metadata": {k: v}, "tensors": {name: {"dtype", "shape", "hex",
"values"?}}}. Checks the framing, the header (UTF-8, JSON object, unique keys, space padding), that
tensors tile the data region with only the zero padding viper.alignment allows, each tensor's
offset alignment, bytes and, where struct can decode the dtype, its values. Prints "ok: ..." and
exits 0, or prints what is wrong and exits 1.
"""
import json
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
STRUCT = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h", "I8": "b",
          "U64": "Q", "U32": "I", "U16": "H", "U8": "B", "BOOL": "?"}


class Bad(Exception):
    pass


def require(cond, message):
    if not cond:
        raise Bad(message)


def unique_keys(pairs):
    keys = [k for k, _ in pairs]
    require(len(keys) == len(set(keys)), "duplicate keys in %r" % keys)
    return dict(pairs)


def read_header(blob):
    require(len(blob) >= 8, "file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    require(8 + n <= len(blob), "header length %d beyond the file" % n)
    require((8 + n) % 8 == 0, "data region starts at %d, not a multiple of 8" % (8 + n))
    text = blob[8:8 + n].decode("utf-8")
    stripped = text.rstrip(" ")
    require(stripped.endswith("}"), "header does not end with '}' followed by spaces only")
    header = json.loads(stripped, object_pairs_hook=unique_keys)
    require(isinstance(header, dict), "header is not an object")
    return header, blob[8 + n:]


def round_up(x, a):
    return (x + a - 1) // a * a


def check_layout(tensors, data, alignment):
    pos = 0
    for name, info in sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        require(set(info) == {"dtype", "shape", "data_offsets"}, "%s: fields %r" % (name, sorted(info)))
        begin, end = info["data_offsets"]
        require(begin in (pos, round_up(pos, alignment)), "%s begins at %d after %d" % (name, begin, pos))
        require(data[pos:begin] == bytes(begin - pos), "%s: padding before it is not zero" % name)
        require(begin % alignment == 0, "%s begins at %d, not a multiple of %d" % (name, begin, alignment))
        count = 1
        for d in info["shape"]:
            count *= d
        require(end - begin == count * SIZES[info["dtype"]], "%s: size mismatch" % name)
        pos = end
    require(pos == len(data), "tensors end at %d, data region is %d bytes" % (pos, len(data)))


def check_values(name, info, expect, data):
    begin, end = info["data_offsets"]
    raw = data[begin:end]
    require(info["dtype"] == expect["dtype"], "%s: dtype %s" % (name, info["dtype"]))
    require(info["shape"] == expect["shape"], "%s: shape %r" % (name, info["shape"]))
    require(raw.hex() == expect["hex"], "%s: bytes differ" % name)
    if "values" in expect:
        fmt = "<%d%s" % (len(raw) // SIZES[info["dtype"]], STRUCT[info["dtype"]])
        got = list(struct.unpack(fmt, raw))
        require(got == expect["values"], "%s: values %r != %r" % (name, got, expect["values"]))


def main():
    blob = open(sys.argv[1], "rb").read()
    expect = json.load(open(sys.argv[2]))
    header, data = read_header(blob)
    meta = header.pop("__metadata__", {})
    require(all(isinstance(v, str) for v in meta.values()), "non-string metadata")
    for k, v in expect["metadata"].items():
        require(meta.get(k) == v, "metadata %s = %r, expected %r" % (k, meta.get(k), v))
    checksum = meta["viper.checksum"]
    require(len(checksum) == 16 and all(c in "0123456789abcdef" for c in checksum), "checksum %r" % checksum)
    alignment = int(meta["viper.alignment"])
    require(alignment == expect["alignment"], "alignment %d" % alignment)
    require(set(header) == set(expect["tensors"]), "tensors %r" % sorted(header))
    check_layout(header, data, alignment)
    for name, info in header.items():
        check_values(name, info, expect["tensors"][name], data)
    print("ok: %d tensors, %d data bytes, alignment %d" % (len(header), len(data), alignment))


if __name__ == "__main__":
    try:
        main()
    except (Bad, ValueError, KeyError) as e:
        print("bad: %s" % e)
        sys.exit(1)
