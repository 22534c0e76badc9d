"""Helpers shared by the Python tests (a module, not a test file: the tests import it by name, as
pytest puts this directory on sys.path)."""
import os
import sys
import time

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


def wait_until(condition, timeout, what, interval=0.01):
    """Polls condition() every `interval` s until it returns a truthy value, which it returns. After `timeout` s
    (monotonic) fails the test with an AssertionError naming `what`: a string, or a callable computed only then,
    so that the message shows the state at the failure; the last value is added when it says more than False/None.
    condition() may itself fail the test (e.g. when the child it waits on exited)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout} s: {what() if callable(what) else what}"
            raise AssertionError(message if value is None or value is False else f"{message} (last: {value!r})")
        time.sleep(interval)
    return value
