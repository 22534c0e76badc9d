"""Helpers shared by the Python tests (a module, not a test file: the tests import it by name, as
pytest puts this directory on sys.path)."""
import socket

import numpy as np


def free_ports(n):
    """n distinct loopback ports free at the time of the call (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


def id_sample_tree(root, n, width, classes=4):
    """A class-per-directory sample tree under `root`: sample i is `width` float32 values all equal
    to i, in class{i % classes}/{i:05d}.bin. Returns root."""
    for c in range(classes):
        (root / f"class{c}").mkdir()
    for i in range(n):
        np.full(width, i, dtype=np.float32).tofile(root / f"class{i % classes}" / f"{i:05d}.bin")
    return root
