#!/usr/bin/python3
"""Writes a safetensors file with one U8 tensor of SIZE bytes of seeded random data.

Usage: make_model.py OUT SIZE SEED [CHANGE_EVERY]
One tensor covering the whole data region: the data region's xxh3 (viper.checksum) is the same
whether or not `viper publish` rebuilds the file into Viper's layout. With CHANGE_EVERY N, every
N-th byte of the same seeded data is flipped (XOR 1): the next version of SEED's model, whose delta
against it is small.
"""
import json
import struct
import sys

import numpy as np


def main() -> int:
    out, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    change_every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-(8 + len(header)) % 64)  # the data region starts 64-byte aligned
    rng = np.random.default_rng(seed)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        step = 64 << 20
        for begin in range(0, size, step):
            chunk = rng.bytes(min(step, size - begin))
            if change_every:  # step is a multiple of it: the same bytes change in every chunk
                data = np.frombuffer(chunk, dtype=np.uint8).copy()
                data[::change_every] ^= 1
                chunk = data.tobytes()
            f.write(chunk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
