"""Downloading CIFAR-10: served from 127.0.0.1 by the test, checksum checked."""

from __future__ import annotations

import functools
import hashlib
import http.server
import tarfile
import threading
from pathlib import Path

import pytest

from conftest import CIFAR_TRAIN, write_cifar
from trainer.data import binary
from trainer.errors import DataError

pytestmark = pytest.mark.integration

NAMES = [*CIFAR_TRAIN, "test_batch.bin"]


@pytest.fixture
def served_tarball(tmp_path):
    """A small cifar-10-binary.tar.gz laid out like the official one, served on a free 127.0.0.1 port."""
    source = write_cifar(tmp_path / "src" / "cifar-10-batches-bin")
    site = tmp_path / "site"
    site.mkdir()
    archive = site / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="cifar-10-batches-bin")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/cifar-10-binary.tar.gz", hashlib.md5(archive.read_bytes()).hexdigest()
    server.shutdown()


def test_download_extracts_and_finds_the_files(tmp_path, served_tarball):
    url, md5 = served_tarball
    data_dir = tmp_path / "data"
    paths = binary.locate(str(data_dir), NAMES, ["cifar-10-batches-bin"], url=url, md5=md5)
    assert [path.name for path in paths] == NAMES
    assert all(path.stat().st_size == 16 * 3073 for path in paths)
    # A second call finds the extracted files without downloading again.
    again = binary.locate(str(data_dir), NAMES, ["cifar-10-batches-bin"], url="http://127.0.0.1:9/none", md5=md5)
    assert again == paths


def test_checksum_mismatch_is_rejected_and_nothing_is_kept(tmp_path, served_tarball):
    url, _ = served_tarball
    data_dir = tmp_path / "data"
    with pytest.raises(DataError, match="md5 check"):
        binary.locate(str(data_dir), NAMES, ["cifar-10-batches-bin"], url=url, md5="0" * 32)
    assert not list(Path(data_dir).rglob("*.bin"))
    assert not (data_dir / "cifar-10-binary.tar.gz").exists()


def test_unreachable_server_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="download of http://127.0.0.1:9/x.tar.gz failed"):
        binary.locate(str(tmp_path), NAMES, [], url="http://127.0.0.1:9/x.tar.gz", md5=None)


def test_a_download_without_internet_says_where_to_put_the_files_by_hand(tmp_path, monkeypatch):
    import socket

    def blocked(*args, **kwargs):
        raise OSError("network is unreachable (blocked by the test)")

    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    monkeypatch.setattr(socket.socket, "connect", blocked)
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
    with pytest.raises(DataError) as raised:
        binary.locate(str(tmp_path / "data"), NAMES, ["cifar-10-batches-bin"], url=url, md5=None)
    message = str(raised.value)
    assert message.startswith(f"download of {url} failed: ")
    assert f"Without internet, download {url} on another machine, extract it and put data_batch_1.bin" in message
    assert f"in {(tmp_path / 'data').resolve()} (or its cifar-10-batches-bin/)" in message
    assert "\n" not in message
