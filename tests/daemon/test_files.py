"""Files the daemon opens as root are what they claim: no symlinked attribute followed, no content echoed, no
untrusted sysfs root, no endless or huge model file, no chown redirected by a swapped socket path."""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import sys

import pytest

from governor.daemon.listen import bind_socket
from governor.errors import BackendError, FtgovError, ModelError
from governor.policy.tree import MAX_MODEL_BYTES, DecisionTree
from governor.sysfs import EXCERPT_CHARS, read_int, write_text
from tests.support import REPO, hostusers
from tests.support.daemon import DEVFREQ, FEATURES, limits
from tests.support.security import BASELINE, needs_root

SECRET = "SECRET-ROOT-ONLY-0123456789-abcdefghijklmnopqrstuvwxyz\n"


def test_a_symlinked_attribute_is_neither_read_nor_written(orin, start_daemon, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    max_freq = orin / DEVFREQ / "max_freq"
    max_freq.unlink()
    max_freq.symlink_to(secret)
    d = start_daemon()
    reply = d.client().request("register", **FEATURES)
    assert "error" in reply and "SECRET" not in str(reply), reply
    assert secret.read_text() == SECRET, "a pin wrote through the symlink"
    assert "SECRET" not in d.log()


def test_an_attribute_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "min_freq"
    os.mkfifo(fifo)
    with pytest.raises(BackendError, match="not a regular file"):
        read_int(fifo)
    with pytest.raises(BackendError, match="not a regular file|No such device"):
        write_text(fifo, "1")  # no reader: ENXIO at once, never a blocked open


def test_a_bad_attribute_shows_only_a_few_characters(tmp_path):
    bad = tmp_path / "max_freq"
    bad.write_text(SECRET)
    with pytest.raises(BackendError) as e:
        read_int(bad)
    assert SECRET[:EXCERPT_CHARS] in str(e.value) and SECRET[EXCERPT_CHARS:EXCERPT_CHARS + 8] not in str(e.value)


def test_a_sysfs_root_another_user_owns_is_refused(orin, start_daemon):
    needs_root()
    os.chown(orin, 4242, 4242)
    d = start_daemon(launch=False)
    d.start(wait=False)
    assert d.proc.wait(30) == 1
    assert "sysfs_root" in d.log() and "belongs to uid 4242" in d.log()
    assert limits(orin) == BASELINE


_LOAD_UNDER_1_GIB = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from governor.errors import ModelError
from governor.policy.tree import DecisionTree
try:
    DecisionTree.load(sys.argv[1])
except ModelError as e:
    print("refused:", e)
"""


def test_dev_zero_as_the_model_file_is_refused_at_once():
    out = subprocess.run([sys.executable, "-c", _LOAD_UNDER_1_GIB, "/dev/zero"], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and "not a regular file" in out.stdout, out


def test_a_huge_model_file_is_refused_unread(tmp_path):
    model = tmp_path / "mlg-tree.json"
    with open(model, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelError, match=f"more than {MAX_MODEL_BYTES}"):
        DecisionTree.load(model)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: nothing near 300 MB


def test_the_socket_is_bound_with_exactly_its_mode_whatever_the_umask(tmp_path):
    for umask in (0, 0o077):
        old = os.umask(umask)
        try:
            sock = bind_socket(str(tmp_path / f"s{umask}.sock"), 0o660, None)
        finally:
            os.umask(old)
        sock.close()
        assert stat.S_IMODE(os.stat(tmp_path / f"s{umask}.sock").st_mode) == 0o660


def test_a_socket_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(FtgovError, match="writable by group or others"):
        bind_socket(str(shared / "ftgov.sock"), 0o660, None)
    assert not (shared / "ftgov.sock").exists()


def test_a_socket_swapped_for_a_symlink_after_bind_does_not_redirect_the_chown(tmp_path, monkeypatch):
    needs_root()
    hostusers.ensure_group("ftgov")
    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    os.chmod(victim, 0o600)
    path = tmp_path / "ftgov.sock"
    real_bind = socket.socket.bind

    def bind_then_swap(self, address):
        # What a user who could write the directory would do between the bind and the chown.
        real_bind(self, address)
        os.unlink(path)
        os.symlink(victim, path)

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)
    with pytest.raises(FtgovError, match="replaced while binding"):
        bind_socket(str(path), 0o660, "ftgov")
    st = os.stat(victim)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)


def test_a_sysfs_root_yet_to_appear_in_a_directory_others_can_write_is_refused(tmp_path):
    # A daemon that waits for the GPU node would otherwise read whatever tree another user builds there meanwhile.
    needs_root()
    from governor.errors import ConfigError
    from governor.sysfs import trusted_root

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(ConfigError, match="nearest existing parent"):
        trusted_root(shared / "later" / "root")
    assert trusted_root(tmp_path / "not-yet").root == tmp_path / "not-yet"  # a parent only root can write: fine
