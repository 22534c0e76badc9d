"""Python's side of the shared registry: Publisher/Node/Subscriber take `registry=`; a consumer given
only the model and a Redis URL finds the producer's node (a real redis-server on a free loopback
port, started and stopped here)."""
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import viper
from helpers import free_port

REDIS = "/usr/bin/redis-server"


def redis_answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_url():
    """A redis-server on a free port (another port if the one picked was taken meanwhile)."""
    with tempfile.TemporaryDirectory() as work:
        for _ in range(8):
            port = free_port()
            proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", work],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while proc.poll() is None and not redis_answers(port) and time.monotonic() < deadline:
                time.sleep(0.02)
            if proc.poll() is None and redis_answers(port):
                break
            proc.kill()
            proc.wait()
        else:
            pytest.fail("redis-server did not start")
        try:
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait()


def test_subscriber_finds_the_publisher_through_redis(redis_url):
    with viper.Subscriber("pyreg", registry=redis_url) as sub:  # before any node holds the model
        assert sub.latest() is None
        with viper.Publisher("pyreg", mode="sync", registry=redis_url) as pub:
            pub.publish({"w": np.arange(8, dtype=np.float32)})
            version = sub.wait_for(1, timeout=30)
            assert version.version == 1
            assert np.array_equal(version["w"], np.arange(8, dtype=np.float32))


def test_embedded_registry_in_one_process():
    with viper.Node(registry="embedded"):
        with viper.Publisher("pyemb", mode="sync", registry="embedded") as pub:
            pub.publish({"w": np.ones(4, dtype=np.int32)})
            with viper.Subscriber("pyemb", registry="embedded") as sub:
                assert sub.wait_for(1, timeout=30).version == 1
    assert "registry ('')" in viper.Subscriber.__doc__


def test_bad_registry_urls_are_value_errors():
    with pytest.raises(ValueError, match="names no backend"):
        viper.Subscriber("m", registry="zookeeper://x")
    with pytest.raises(ValueError, match="larger than 65535"):
        viper.Node(registry="redis://127.0.0.1:70000")
