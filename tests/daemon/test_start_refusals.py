"""A start that cannot serve as asked refuses in one line and leaves everything as it found it: another daemon on the
same simulated tree, a socket in a directory that does not exist, an FFG frequency in the wrong unit."""

from __future__ import annotations

from tests.support.daemon import FEATURES, Daemon, limits

START_S = 30


def start_second(first: Daemon, name: str, *extra_args: str) -> tuple[int, list[str]]:
    """A second `ftgovd --simulate` on the first's state directory: its exit status and its log's lines."""
    second = Daemon(None, workdir=first.workdir, simulate=True, notify_name=f"{name}.sock", extra_args=extra_args,
                    log_path=first.workdir / f"{name}.log")
    try:
        second.start(wait=False)
        rc = second.proc.wait(START_S)
        return rc, second.log_path.read_text().splitlines()
    finally:
        second.close()


def test_a_second_simulated_daemon_leaves_the_first_daemon_and_its_tree_alone():
    first = Daemon(None, simulate=True)
    try:
        first.start()
        c = first.client()
        job = c.call("register", **FEATURES)
        assert job["freq_hz"] == 714_000_000
        root = first.state_dir / "sim-orin"
        node = next((root / "sys/devices/platform").rglob("min_freq"))
        before = (node.stat().st_ino, limits(root))

        rc, lines = start_second(first, "second")  # the same socket and the same tree
        assert rc != 0 and len(lines) == 1 and "another ftgovd is already listening on" in lines[0], lines

        rc, lines = start_second(first, "third", "--socket", str(first.workdir / "other.sock"))  # the same tree only
        assert rc != 0 and len(lines) == 1, lines
        assert "another ftgovd --simulate is using the simulated tree" in lines[0], lines

        # The tree was not rebuilt under the first daemon: same files, its job still pinned at 714 MHz.
        assert (node.stat().st_ino, limits(root)) == (node.stat().st_ino, (714_000_000, 714_000_000)) == before
        status = c.call("status")
        assert [j["job_id"] for j in status["jobs"]] == [job["job_id"]]
        assert status["gpus"][0]["pinned_hz"] == 714_000_000 and status["gpus"][0]["throttled_hz"] is None
        c.call("unregister", job_id=job["job_id"])
        assert first.stop() == 0
    finally:
        first.close()

    # Once the first has stopped, its lock is gone with it: a new daemon takes the tree.
    again = Daemon(None, workdir=first.workdir, simulate=True, notify_name="n3.sock")
    try:
        again.start()
        assert again.client().call("register", **FEATURES)["freq_hz"] == 714_000_000
    finally:
        again.close()


def test_a_socket_in_a_missing_directory_is_refused_and_not_created(tmp_path, start_daemon):
    missing = tmp_path / "no" / "such"
    d = start_daemon(extra_args=("--socket", str(missing / "ftgov.sock")), launch=False)
    d.start(wait=False)
    assert d.proc.wait(START_S) != 0
    lines = d.log_path.read_text().splitlines()
    assert len(lines) == 1 and f"the socket's directory {missing} does not exist" in lines[0], lines
    assert not (tmp_path / "no").exists()


def test_an_ffg_frequency_in_mhz_is_refused_naming_the_key_and_the_unit(start_daemon):
    d = start_daemon(config={"policy": "ffg", "ffg_freq_hz": 816}, launch=False)
    d.start(wait=False)
    assert d.proc.wait(START_S) == 2
    lines = d.log_path.read_text().splitlines()
    assert lines == [f"ftgovd: error: config file {d.config_path}: ffg_freq_hz: Value error, 816 Hz is below 1 MHz: "
                     "the value is in Hz (816 MHz would be 816000000)"]


def test_an_ffg_frequency_outside_the_gpus_table_is_refused(start_daemon):
    d = start_daemon(config={"policy": "ffg", "ffg_freq_hz": 5_000_000_000}, launch=False)
    d.start(wait=False)
    assert d.proc.wait(START_S) == 1  # as for every start-up error found once the hardware is known
    errors = [line for line in d.log_path.read_text().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "ffg_freq_hz: 5000000000 Hz (5000 MHz) is in no GPU's table of levels" in errors[0]
    assert "GPU 0: 306..1300.5 MHz" in errors[0]


def test_a_config_that_is_not_text_is_refused_in_one_line(start_daemon):
    d = start_daemon(launch=False)
    d.config_path.write_bytes(b"policy: ffg # r\xe9glage\n")
    d.start(wait=False)
    assert d.proc.wait(START_S) == 2
    lines = d.log_path.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == f"ftgovd: error: config file {d.config_path} is not valid YAML: " \
        "unacceptable character #x00e9: invalid continuation byte", lines
