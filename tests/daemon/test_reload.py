"""SIGHUP reloads the config and the model; pins and jobs stay; a bad new config is refused and the old one kept."""

import json

import pytest

from tests.support.daemon import FEATURES, REPO, limits, reload, rewrite_config


def test_a_reload_changes_the_policy_for_new_jobs_and_keeps_the_running_ones(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    first = c.call("register", **FEATURES)
    assert first["policy"] == "mlg" and limits(orin) == (714_000_000, 714_000_000)
    rewrite_config(d, policy="ffg", ffg_freq_hz=918_000_000)
    reload(d, "config reloaded")
    status = c.call("status")  # the same connection: the daemon did not restart
    assert [j["job_id"] for j in status["jobs"]] == [first["job_id"]] and status["jobs"][0]["policy"] == "mlg"
    assert status["policy"] == "ffg" and limits(orin) == (714_000_000, 714_000_000)
    second = c.call("register", **FEATURES)
    assert (second["policy"], second["freq_hz"]) == ("ffg", 918_000_000)
    assert limits(orin) == (918_000_000, 918_000_000)
    assert "config and model reloaded: policy ffg; 1 running job(s) keep their pins" in d.log()


def test_a_bad_new_config_is_refused_with_the_reason(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)
    rewrite_config(d, limits={"max_connections": 0})
    message = reload(d, "reload refused")
    assert "limits.max_connections" in message
    assert d.proc.poll() is None and c.call("status")["jobs"][0]["job_id"] == job["job_id"]
    assert limits(orin) == (714_000_000, 714_000_000)
    assert "reload refused: " in d.log() and "the running config and model stay" in d.log()
    assert c.call("register", **FEATURES)["policy"] == "mlg"  # the old config still decides


def test_a_model_that_cannot_be_loaded_is_refused(orin, start_daemon, tmp_path):
    d = start_daemon()
    rewrite_config(d, model_file=str(tmp_path / "missing.json"))
    assert "cannot read model file" in reload(d, "reload refused")
    res = d.client().call("register", **FEATURES)
    assert (res["policy"], res["freq_hz"]) == ("mlg", 714_000_000)  # the tree, not FFG
    # Nor does the log say otherwise: a refused model's fallback was never made.
    assert "MLG falls back to FFG" not in d.log()


def test_a_reload_applies_the_new_connection_limits_root_reserve_and_idle_timeout(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)
    idle = d.client()
    assert idle.call("ping") == {}
    rewrite_config(d, limits={"max_connections": 2, "root_reserve_connections": 1, "max_connections_per_uid": 16,
                              "idle_timeout_s": 1.0})
    reload(d, "config reloaded")
    # The connection open before the reload, holding no job, is closed on the new timeout (EOF: recv returns b"").
    assert idle.sock.recv(1) == b""
    idle.close()
    others = [d.client(), d.client()]  # two ordinary slots, then root's one reserved connection
    for other in others:
        assert other.call("ping") == {}
    refused = d.client().read_reply()
    assert refused["error"]["code"] == -32002 and "root_reserve_connections" in refused["error"]["message"], refused
    assert c.call("status")["jobs"][0]["job_id"] == job["job_id"]  # holding a job: never idle-closed


def hand_edited(tmp_path, name: str, **fields) -> str:
    """The paper's tree (the test daemons' model) with top-level fields replaced, as an operator's editor leaves it."""
    doc = json.loads((REPO / "governor" / "data" / "paper-tree.json").read_text())
    path = tmp_path / name
    path.write_text(json.dumps({**doc, **fields}))
    return str(path)


@pytest.mark.parametrize("fields, fault", [
    ({"features": None}, "features must be"),
    ({"metadata": ["retrained by hand"]}, "metadata must be an object"),
])
def test_a_hand_edited_model_of_the_wrong_shape_is_refused_on_reload_and_the_tree_in_use_kept(
        orin, start_daemon, tmp_path, fields, fault):
    d = start_daemon(config={"store": {"path": str(tmp_path / "store.sqlite")}})
    rewrite_config(d, model_file=hand_edited(tmp_path, "edited.json", **fields))
    assert fault in reload(d, "reload refused")
    c = d.client()
    res = c.call("register", **FEATURES)
    assert (res["policy"], res["freq_hz"]) == ("mlg", 714_000_000) and res["reason"].startswith("paper tree:")
    c.call("unregister", job_id=res["job_id"])
    assert "Traceback" not in d.log()


def test_a_hand_edited_model_of_the_wrong_shape_at_start_falls_back_with_the_reason(orin, start_daemon, tmp_path):
    d = start_daemon(config={"model_file": hand_edited(tmp_path, "edited.json", features=None),
                             "store": {"path": str(tmp_path / "store.sqlite")}})
    res = d.client().call("register", **FEATURES)
    assert res["policy"] == "mlg->ffg" and "features must be" in res["reason"]
    assert "MLG falls back to FFG" in d.log() and "Traceback" not in d.log()


def test_a_new_config_that_is_not_text_is_refused_and_the_daemon_says_so(orin, start_daemon):
    """A UnicodeDecodeError escaped the reload as a traceback, without the READY=1 that ends systemd's reload."""
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)
    d.config_path.write_bytes(b"policy: ffg # r\xe9glage\n")
    message = reload(d, "reload refused")
    assert f"config file {d.config_path} is not valid YAML" in message and "Traceback" not in d.log()
    assert c.call("status")["jobs"][0]["job_id"] == job["job_id"]
    assert c.call("register", **FEATURES)["policy"] == "mlg"


def test_a_new_config_with_a_key_given_twice_is_refused_naming_it(orin, start_daemon):
    """PyYAML keeps the second `policy:`; the operator who added it below the first may have meant either."""
    d = start_daemon()
    d.config_path.write_text(d.config_path.read_text() + "policy: ffg\npolicy: tune\n")
    assert "duplicate key 'policy'" in reload(d, "reload refused")
    assert d.client().call("register", **FEATURES)["policy"] == "mlg"


def test_a_reload_that_fails_unexpectedly_still_ends_systemds_reload():
    """RELOADING=1 then READY=1 whatever the reload raised: without the READY=1 `systemctl reload` hangs and the unit
    stays 'reloading'. The server logs what escaped (Server._reload)."""
    from governor.daemon.reload import Reloader

    sent: list[str] = []

    class Server:
        notifier = type("Notifier", (), {"send": staticmethod(sent.append)})()
        config = None

    def broken():
        raise RuntimeError("a bug in reloading")

    with pytest.raises(RuntimeError):
        Reloader(broken, lambda config: None)(Server())
    assert sent[0].startswith("RELOADING=1") and sent[-1].startswith("READY=1\nSTATUS=reload failed")


def test_raised_connection_limits_raise_the_open_file_limit_on_reload(orin, start_daemon):
    """The descriptors the limits need were reserved at start only: raising limits.max_connections by reload left
    the soft limit where it was, and the new connections refused as near the open-file limit."""
    def soft_nofile() -> int:
        line = next(x for x in open(f"/proc/{d.proc.pid}/limits") if x.startswith("Max open files"))
        return int(line.split()[3])

    # systemd gives 1024:524288; this machine's hard limit may be lower
    d = start_daemon(config={"limits": {"max_connections": 256}}, nofile=(1024, 16384))
    before = soft_nofile()
    cfg_limits = {"max_connections": 4000, "max_connections_per_uid": 250}
    rewrite_config(d, limits=cfg_limits)
    reload(d, "config reloaded")
    assert before < 2 * 4000 <= soft_nofile()
