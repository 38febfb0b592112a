"""load_config: defaults, overrides, and loud errors that name the key."""

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from governor.config import TunerConfig, load_config
from governor.errors import ConfigError
from governor.policy.tuner import OnlineTuner, WindowRule


def refused_naming(path: Path, text: str, key: str, says: str) -> None:
    """A config of ``text`` at ``path`` is refused with ``key: says`` (says a regular expression)."""
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: {says}"):
        load_config(path)


def test_an_absent_file_means_defaults(tmp_path):
    cfg = load_config(tmp_path / "none.yaml")
    assert cfg.limits.max_jobs == 64 and cfg.socket.mode == 0o660


def test_an_absent_file_named_explicitly_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml", must_exist=True)


def test_overrides_win_key_by_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("limits:\n  max_jobs: 10\n  max_jobs_per_uid: 5\nsocket:\n  path: /tmp/a.sock\n")
    cfg = load_config(path, {"socket.path": "/tmp/b.sock", "state_dir": None})
    assert (cfg.limits.max_jobs, cfg.limits.max_jobs_per_uid, cfg.socket.path) == (10, 5, "/tmp/b.sock")


@pytest.mark.parametrize("text, key", [
    ("limits:\n  max_connections: 0\n", "limits.max_connections"),
    ("socket:\n  mode: 0666\n", "socket.mode"),
    ("nonsense: 1\n", "nonsense"),
    ("policy: fastest\n", "policy"),
    ("ffg_freq_hz: 816\n", "ffg_freq_hz: Value error, 816 Hz is below 1 MHz: the value is in Hz"),
    ("ffg_freq_hz: 0\n", "ffg_freq_hz: Value error, 0 Hz is below 1 MHz"),
    # sysfs's devfreq speaks kHz elsewhere: read as MHz, 816000 was offered back as 816 THz.
    ("ffg_freq_hz: 816000\n", r"816000 Hz is below 1 MHz: the value is in Hz \(816000 kHz would be 816000000\)"),
    ("ffg_freq_hz: 816000000000\n", r"816000000000 Hz is above any GPU's clock \(10 GHz\)"),  # three zeros too many
    ("tuner:\n  confirm_contenders: 0\n", "tuner.confirm_contenders"),
    ("tuner:\n  window_explore_z: 0\n", "tuner.window_explore_z"),
])
def test_a_bad_value_names_its_key(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(path)


def test_the_tuners_knobs_reach_the_tuner(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tuner:\n  confirm_contenders: 3\n  drift_rel: 0.05\n")
    tuner = load_config(path).tuner.new_tuner([510_000_000, 612_000_000, 714_000_000], 612_000_000)
    assert tuner.confirm_contenders == 3 and tuner.settings.drift_rel == 0.05


def test_the_window_rules_z_scores_reach_the_rule(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tuner:\n  window_decide_z: 2.5\n  window_explore_z: 1.2\n")
    rule = load_config(path).tuner.window(0.1)
    assert (rule.decide_z, rule.explore_z) == (2.5, 1.2)
    assert TunerConfig().window(0.1).explore_z == WindowRule.explore_z == 1.5


def test_the_daemon_confirms_two_near_ties_and_an_exact_meter_one():
    """On a real meter the second near-tie is often the level an excursion misread once (docs/tuner.md); the tuner's
    own default and the exact-meter simulations keep one."""
    levels = [510_000_000, 612_000_000, 714_000_000]
    assert TunerConfig().new_tuner(levels, 612_000_000).confirm_contenders == 2
    assert TunerConfig.exact_meter().new_tuner(levels, 612_000_000).confirm_contenders == 1
    assert OnlineTuner(levels, 612_000_000).confirm_contenders == 1


@pytest.mark.parametrize("text", ["- a\n- b\n", "a: [\n"])
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


def test_the_baseline_window_spans_at_least_baseline_min_steps_on_the_windows_rule():
    """The measured saving rests on the baseline: it takes the windows' rule, but at least 30 steps (a few long steps
    that scatter read its J/step several percent off), closes at its own target (0.75%), and at most at
    baseline_max_s or baseline_max_share of the job's steps (a job of unknown length: the tuner's 2,000); fixed-step
    windows stay as they are. In one part (baseline_parts 1) that is its one window's rule."""
    from governor.config import TunerConfig

    cfg = TunerConfig(window_rule="time", baseline_parts=1)
    rule, base = cfg.window(0.1), cfg.baseline_window_rule(0.1)
    assert base.min_steps == 30 and base.max_s == 600.0 and base.target_rel == 0.0075 < rule.target_rel
    assert base.min_s == rule.min_s and base.min_updates == rule.min_updates
    assert base.max_steps == 100 and cfg.baseline_window_rule(0.1, 20_000).max_steps == 1000
    assert cfg.baseline_window_rule(0.1, 100).max_steps == 30  # never under baseline_min_steps
    wide = TunerConfig(window_rule="time", window_min_steps=50, window_max_s=100, baseline_max_s=10, baseline_parts=1)
    assert wide.baseline_window_rule(0.1).min_steps == 50 and wide.baseline_window_rule(0.1).max_s == 100
    assert TunerConfig(window_rule="steps").baseline_window_rule(0.1) is None
    assert TunerConfig(window_rule="steps").baseline_budget_steps() is None


def test_the_baseline_in_parts_gives_each_its_share_of_the_steps_time_and_precision():
    """baseline_parts 5 (the default): each part a fifth of the budget (at least a fifth of baseline_min_steps, and
    the windows' own least), a fifth of baseline_max_s, its target sqrt(5) times the baseline's (five of them average
    to it)."""
    from governor.config import TunerConfig

    cfg = TunerConfig(window_rule="time")
    part = cfg.baseline_window_rule(0.1)
    assert cfg.baseline_parts == 5 and cfg.baseline_budget_steps() == 100 and cfg.baseline_budget_steps(20_000) == 1000
    assert part.max_steps == 20 and cfg.baseline_window_rule(0.1, 20_000).max_steps == 20  # 50 parts of 20 000 steps
    assert part.min_steps == 6 and part.max_s == 120.0 and part.target_rel == pytest.approx(0.0075 * 5 ** 0.5)
    assert part.min_s == cfg.window_min_s  # a part is still a window: at least window_min_s long
    with pytest.raises(ValidationError):
        TunerConfig(baseline_parts=0)


def test_the_shipped_configs_commented_tuner_settings_load_as_they_read(tmp_path):
    """etc/ftgov.yaml shows the tuner's two priced settings commented out, at their defaults: uncommented, they load,
    and they are the defaults (so the comment cannot drift from the code unnoticed)."""
    shipped = (Path(__file__).resolve().parent.parent / "etc" / "ftgov.yaml").read_text().splitlines()
    start = shipped.index("# tuner:")
    block = [line.removeprefix("# ") for line in shipped[start:start + 3]]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(block) + "\n")
    tuner = load_config(path).tuner
    assert {k: getattr(tuner, k) for k in ("window_target_rel", "baseline_max_share")} == {
        k: TunerConfig.model_fields[k].default for k in ("window_target_rel", "baseline_max_share")}


def test_the_baselines_parts_grow_with_the_jobs_length():
    from governor.config import TunerConfig
    from governor.policy.measured_saving import MAX_PARTS

    cfg = TunerConfig()
    assert cfg.baseline_parts_for(2000) == cfg.baseline_parts_for(None) == cfg.baseline_parts_for(300) == 5
    assert cfg.baseline_parts_for(8000) == 20 and cfg.baseline_parts_for(200_000) == MAX_PARTS
    assert TunerConfig(baseline_parts=1).baseline_parts_for(200_000) == 1  # the one window at the start stays one
    # Each part's rule takes its share of the longer job's budget.
    rule = cfg.baseline_window_rule(0.1, 8000)
    assert rule.max_steps == cfg.baseline_budget_steps(8000) // 20


@pytest.mark.parametrize("text, first, again", [
    ("policy: ffg\npolicy: mlg\n", 1, 2),
    ("limits:\n  max_jobs: 3\nstore:\n  max_jobs: 5\nlimits:\n  max_connections: 5\n", 1, 5),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, text, first, again):
    """PyYAML keeps the last of two equal keys: a second `limits:` section dropped the first with all its keys."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"duplicate key '\w+': given on line {first}, and again\n.*line {again},"):
        load_config(path)


def test_a_merge_key_may_still_be_overridden_by_the_mappings_own_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("limits:\n  <<: {max_jobs: 3, max_jobs_per_uid: 2}\n  max_jobs: 4\n")
    assert (load_config(path).limits.max_jobs, load_config(path).limits.max_jobs_per_uid) == (4, 2)


def test_a_file_that_is_not_text_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"policy: ffg # r\xe9glage\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=f"config file {path} is not valid YAML: .*invalid continuation byte"):
        load_config(path)


def test_a_file_whose_every_key_is_commented_out_means_defaults_as_an_empty_one(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# policy: ffg\n#limits:\n#  max_jobs: 3\n")
    assert load_config(path) == load_config(tmp_path / "none.yaml")


def test_a_file_larger_than_any_config_is_refused_unparsed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("#" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match=f"config file {path}: it is larger than 1024 KiB: not a config file"):
        load_config(path)


def test_a_directory_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}: Is a directory"):
        load_config(tmp_path)


def test_a_section_whose_every_key_is_commented_out_means_its_defaults(tmp_path):
    """`socket:` with its keys commented out is null: it stopped the daemon ("socket: Input should be a valid
    dictionary or instance of SocketConfig"), where a file whose every key is commented out means the defaults."""
    path = tmp_path / "c.yaml"
    path.write_text("socket:\n  # path: /run/ftgov/ftgov.sock\ntuner:\n")
    assert load_config(path) == load_config(tmp_path / "none.yaml")
    assert load_config(path, {"socket.path": "/tmp/x.sock"}).socket.path == "/tmp/x.sock"


def test_a_sections_key_left_unindented_is_named_with_its_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy: tune\ntuner:\nwindow_target_rel: 0.03\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (f"config file {path}: window_target_rel: Extra inputs are not permitted (a key of "
                            "tuner: indent it under its section)")


def test_a_misspelt_key_is_named_with_the_key_it_misspells(tmp_path):
    """`polcy: ffg` said only "Extra inputs are not permitted": which key was meant, in its own section."""
    path = tmp_path / "c.yaml"
    path.write_text("polcy: ffg\nlimits:\n  max_job: 3\ntuner:\n  window_target_rell: 0.03\nfoo: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (f"config file {path}: "
                            "limits.max_job: Extra inputs are not permitted (did you mean limits.max_jobs?); "
                            "tuner.window_target_rell: Extra inputs are not permitted (did you mean "
                            "tuner.window_target_rel?); "
                            "polcy: Extra inputs are not permitted (did you mean policy?); "
                            "foo: Extra inputs are not permitted")


def test_an_override_under_a_key_that_holds_no_section_names_the_key(tmp_path):
    """--socket must not end in a TypeError where the file's socket is no mapping."""
    path = tmp_path / "c.yaml"
    path.write_text("socket: /run/ftgov/ftgov.sock\n")
    with pytest.raises(ConfigError, match="socket: Input should be a valid dictionary"):
        load_config(path, {"socket.path": "/tmp/x.sock"})


def test_a_thousand_bad_keys_are_named_by_the_first_ten(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("".join(f"k{i}: 1\n" for i in range(1000)))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).endswith("k9: Extra inputs are not permitted; and 990 more")


@pytest.mark.parametrize("text, key", [
    ("limits:\n  max_jobs: yes\n", "limits.max_jobs"),  # pydantic took it for 1 job
    ("power_cap_w: true\n", "power_cap_w"),  # 1 W
    ("tuner:\n  window_min_updates: off\n", "tuner.window_min_updates"),  # 0
])
def test_a_boolean_is_no_number(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    refused_naming(path, text, key, r"Value error, \w+ is a boolean")
    path.write_text("restore_on_stop: off\ntuner:\n  follow_up: no\n")  # where a boolean is meant, YAML's are fine
    assert (load_config(path).restore_on_stop, load_config(path).tuner.follow_up) == (False, False)


@pytest.mark.parametrize("key, text", [
    ("model_file", "model_file: ''\n"),  # was the shipped tree, silently
    ("sysfs_root", "sysfs_root: ''\n"),
    ("state_dir", "state_dir: ''\n"),
    ("socket.path", "socket:\n  path: ''\n"),
])
def test_an_empty_path_is_refused_naming_its_key(tmp_path, key, text):
    refused_naming(tmp_path / "c.yaml", text, key, "String should have at least 1 character")


@pytest.mark.parametrize("key, text", [
    ("state_dir", "state_dir: ftgov-state\n"),  # /ftgov-state under systemd, ./ftgov-state by hand
    ("sysfs_root", "sysfs_root: sim\n"),
    ("model_file", "model_file: tree.json\n"),
    ("socket.path", "socket:\n  path: ftgov.sock\n"),
    ("store.path", "store:\n  path: measurements.sqlite\n"),
])
def test_a_relative_path_is_refused_naming_its_key(tmp_path, key, text):
    """ftgovd runs from / under systemd and from anywhere by hand: a relative path names a different file under each,
    which root would make or read there."""
    refused_naming(tmp_path / "c.yaml", text, key, "Value error, '[^']+' is a relative path: give an absolute one")
    (tmp_path / "ok.yaml").write_text("store:\n  path: auto\n")
    assert load_config(tmp_path / "ok.yaml").store.path == "auto"


def test_node_wait_s_is_bounded(tmp_path):
    """.inf is refused as every infinity is; 1e300 s waited for ever too."""
    refused_naming(tmp_path / "c.yaml", "node_wait_s: 1e300\n", "node_wait_s", "Input should be less than or equal")


def test_the_shipped_config_names_every_key_at_its_default(tmp_path):
    """README: the shipped file has every key explained. Each top-level key is in it, set or commented out; those
    commented out at the file's end load, uncommented, as the defaults."""
    from governor.config import Config

    shipped = (Path(__file__).resolve().parent.parent / "etc" / "ftgov.yaml").read_text().splitlines()
    named = {m.group(1) for m in (re.match(r"(?:# )?([a-z_]+):", line) for line in shipped) if m}
    assert set(Config.model_fields) <= named, set(Config.model_fields) - named
    rest = [line.removeprefix("# ")
            for line in shipped[shipped.index("# The rest, commented out at their defaults:") + 1:]]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(rest) + "\n")
    assert load_config(path) == load_config(tmp_path / "none.yaml")


@pytest.mark.parametrize("text, key", [
    ("node_wait_s: .inf\n", "node_wait_s"),  # waited for the GPU node for ever
    ("sample_interval_s: .nan\n", "sample_interval_s"),  # was refused as "less than or equal to 3600"
    ("tuner:\n  noise_rel: .nan\n", "tuner.noise_rel"),
])
def test_no_key_takes_an_infinity_or_nan(tmp_path, text, key):
    refused_naming(tmp_path / "c.yaml", text, key, "Input should be a finite number")


def test_a_relative_path_on_the_command_line_is_from_where_it_was_typed(tmp_path, monkeypatch):
    """On the command line a relative path means the working directory, as everywhere: made absolute there, before the
    config (which refuses relative paths) sees it."""
    from governor.cli import build_parser
    from governor.daemon.main import build_config, parse_args

    monkeypatch.chdir(tmp_path)
    args = parse_args(["--state-dir", "state", "--socket", "s.sock", "--sysfs-root", "tree"])
    config = build_config(args)
    assert (config.state_dir, config.socket.path, config.sysfs_root) == (
        str(tmp_path / "state"), str(tmp_path / "s.sock"), str(tmp_path / "tree"))
    doctor = build_parser().parse_args(["doctor", "--state-dir", "state", "--sysfs-root", "tree"])
    assert (doctor.state_dir, doctor.sysfs_root) == (str(tmp_path / "state"), str(tmp_path / "tree"))


def test_ftgovd_takes_its_log_level_in_either_case():
    from governor.daemon.main import parse_args

    assert parse_args(["--log-level", "DEBUG"]).log_level == "debug"
