"""Helpers shared by the Python tests (a module, not a test file: the tests import it by name, as
pytest puts this directory on sys.path)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from loopback_ports import free_port, free_ports  # noqa: E402,F401  (one rule for tests and benches)


def id_sample_tree(root, n, width, classes=4):
    """A class-per-directory sample tree under `root`: sample i is `width` float32 values all equal
    to i, in class{i % classes}/{i:05d}.bin. Returns root."""
    for c in range(classes):
        (root / f"class{c}").mkdir()
    for i in range(n):
        np.full(width, i, dtype=np.float32).tofile(root / f"class{i % classes}" / f"{i:05d}.bin")
    return root
