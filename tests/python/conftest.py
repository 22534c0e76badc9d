"""Shared pytest settings for tests/python.

With VIPER_FAIL_ON_SKIP=1 (set by CTest) a session in which any test was skipped fails: in CI a
test that did not run must not count as a pass. Run by hand without it to see skips as skips.
"""
import os

import pytest

_skipped = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
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
