"""Shared pytest settings for tests/python.

With VIPER_FAIL_ON_SKIP=1 (set by CTest) a session in which any test was skipped fails: in CI a
test that did not run must not count as a pass. Run by hand without it to see skips as skips.
"""
import os
import subprocess

import pytest

_skipped = []

# A node killed by a test (a rank, a producer, `viper serve`) leaves its shared-memory segments
# (/dev/shm/<prefix>.<pid>.<seq>) for a restart that never comes. Every process a test starts is
# remembered; at the end of the session the segments of those that are dead go (nothing is removed
# while tests run, so a test that restarts a killed node still finds them).
_spawned = []
_popen_init = subprocess.Popen.__init__


def _remembering_init(self, *args, **kwargs):
    _popen_init(self, *args, **kwargs)
    _spawned.append(self.pid)


subprocess.Popen.__init__ = _remembering_init


def _sweep_segments_of_dead_children():
    dead = set()
    for pid in _spawned:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.add(pid)
        except PermissionError:
            pass
    if not dead:
        return
    for name in os.listdir("/dev/shm"):
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[1]) in dead:
            path = os.path.join("/dev/shm", name)
            try:
                st = os.lstat(path)
                if st.st_uid == os.geteuid() and not os.path.islink(path):
                    os.unlink(path)
            except OSError:
                pass


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    _sweep_segments_of_dead_children()
    if os.environ.get("VIPER_FAIL_ON_SKIP") == "1" and _skipped and exitstatus == 0:
        print(f"\nVIPER_FAIL_ON_SKIP: {len(_skipped)} test(s) skipped: {', '.join(_skipped)}")
        session.exitstatus = 1


@pytest.fixture
def pair():
    """A publisher (embedded node on a free loopback port, sync mode) of model "m" and a subscriber
    connected to it; both closed after the test."""
    import viper  # here, not at the top: conftest runs for tests that check importing itself

    pub = viper.Publisher("m", listen="127.0.0.1:0", mode="sync")
    sub = viper.Subscriber("m", connect=pub.address)
    yield pub, sub
    sub.close()
    pub.close()
