"""Free loopback TCP ports for the benchmarks and the Python tests (tests/python/helpers.py
re-exports them)."""
import random
import socket


def free_ports(n):
    """n distinct loopback ports free at the time of the call, drawn from below the kernel's
    ephemeral range (32768-60999 by default): a port that bind(0) hands out and that is released
    again can be taken by any process's next outgoing connection before the caller's server
    listens on it; outgoing connections never take a port below that range."""
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
