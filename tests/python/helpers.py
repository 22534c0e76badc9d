"""Helpers shared by the Python tests (a module, not a test file: the tests import it by name, as
pytest puts this directory on sys.path)."""
import random
import socket

import numpy as np


def free_ports(n):
    """n distinct loopback ports free at the time of the call, drawn from below the kernel's
    ephemeral range (32768-60999 by default): a port that bind(0) hands out and that is released
    again can be taken by any process's next outgoing connection before the test's server listens
    on it; outgoing connections never take a port below that range."""
    rng = random.Random()
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(20000, 32000)))
            except OSError:  # taken: draw again
                s.close()
                continue
            socks.append(s)  # held until all are drawn, so that they differ
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
