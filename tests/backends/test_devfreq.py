"""The devfreq backend against fake sysfs trees in both JetPack layouts, including write failures."""

import os
from pathlib import Path

import pytest

from governor.backends import devfreq
from governor.backends.base import Limits, nearest_level
from governor.errors import BackendError, NodeNotFound, PinError
from governor.sim import tree
from governor.sysfs import Root
from tests.support import READ_ONLY_INT_FILE


@pytest.mark.parametrize("layout,node_name,levels", [("jp6", "17000000.gpu", tree.JP6_LEVELS_HZ),
                                                     ("jp5", "17000000.ga10b", tree.JP5_LEVELS_HZ)])
def test_discovers_gpu_node_and_skips_other_devfreq_nodes(tmp_path, layout, node_name, levels):
    root = tree.build(tmp_path, layout)
    assert sorted(os.listdir(tmp_path / "sys/class/devfreq")) == sorted([node_name, "15340000.vic"])
    (gpu,) = devfreq.probe(root)
    assert gpu.node.name == node_name
    assert gpu.levels_hz == levels
    assert gpu.describe()["devfreq"].endswith(f"/devfreq/{node_name}")
    assert gpu.read().load_pct == 0.0


@pytest.mark.parametrize("raw,pct", [("1000", 100.0), ("1500", 100.0), ("-3", 0.0), ("437", 43.7)])
def test_load_is_read_as_a_percentage_within_its_bounds(tmp_path, raw, pct):
    root = tree.build(tmp_path, "jp6")
    (gpu,) = devfreq.probe(root)
    gpu.load_path.write_text(raw + "\n")
    assert gpu.read().load_pct == pct


def test_discovery_follows_absolute_links_under_the_root(tmp_path):
    root = tree.build(tmp_path, "jp6")
    link = tmp_path / "sys/class/devfreq/17000000.gpu"
    link.unlink()
    link.symlink_to("/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu")  # as absolute as a board's
    (gpu,) = devfreq.probe(root)
    assert gpu.node == tmp_path / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"


def test_matches_by_compatible_when_the_name_is_unknown(tmp_path):
    root = tree.build(tmp_path, "jp6")
    (tmp_path / "proc/device-tree/bus@0/gpu@17000000/name").write_text("xyz\0")
    assert devfreq.probe(root)[0].node.name == "17000000.gpu"
    (tmp_path / "proc/device-tree/bus@0/gpu@17000000/compatible").write_text("acme,thing\0")
    with pytest.raises(NodeNotFound):
        devfreq.probe(root)


def test_missing_node_is_node_not_found(tmp_path):
    with pytest.raises(NodeNotFound, match="no devfreq class"):
        devfreq.probe(Root(tmp_path))
    (tmp_path / "sys/class/devfreq").mkdir(parents=True)
    with pytest.raises(NodeNotFound, match="no GPU devfreq node"):
        devfreq.probe(Root(tmp_path))


@pytest.mark.parametrize("layout", ["jp6", "jp5"])
def test_pin_every_level_then_restore(tmp_path, layout):
    root = tree.build(tmp_path, layout)
    (gpu,) = devfreq.probe(root)
    baseline = gpu.snapshot()
    for level in list(gpu.levels_hz) + list(reversed(gpu.levels_hz)):
        gpu.pin(level)
        assert gpu.snapshot() == Limits(level, level)
    gpu.restore(baseline)
    assert gpu.snapshot() == baseline


def test_pin_refuses_a_frequency_not_in_the_table(tmp_path):
    (gpu,) = devfreq.probe(tree.build(tmp_path, "jp6"))
    with pytest.raises(PinError, match="not a level"):
        gpu.pin(700_000_000)
    assert gpu.snapshot() == Limits(306000000, 1300500000)


def test_widen_first_order_keeps_min_below_max(tmp_path):
    """Look at the limits after every single write the backend makes: min <= max must hold at each step."""
    (gpu,) = devfreq.probe(tree.build(tmp_path, "jp6"))
    seen = []
    real_write = devfreq.write_text

    def recording_write(path, value):
        real_write(path, value)
        seen.append(gpu.snapshot())

    devfreq.write_text = recording_write
    try:
        gpu.pin(1224000000)   # raising: max then min
        gpu.pin(408000000)    # lowering: min then max
        gpu.restore(Limits(306000000, 1300500000))
    finally:
        devfreq.write_text = real_write
    assert all(s.min_hz <= s.max_hz for s in seen), seen




@pytest.mark.parametrize("name,target_hz", [("max_freq", 1224000000), ("min_freq", 408000000)])
def test_read_only_file_is_a_backend_error_naming_it(tmp_path, name, target_hz):
    root = tree.build(tmp_path, "jp6")
    (gpu,) = devfreq.probe(root)
    path = gpu.node / name
    path.unlink()
    path.symlink_to(READ_ONLY_INT_FILE)
    with pytest.raises(BackendError, match=name):
        gpu.pin(target_hz)


def test_pin_that_does_not_read_back_is_a_pin_error(tmp_path):
    root = tree.build(tmp_path, "jp6")
    (gpu,) = devfreq.probe(root)
    # A "kernel" that ignores writes to min_freq: the read-back must catch it.
    min_freq = gpu.node / "min_freq"
    min_freq.unlink()
    min_freq.symlink_to(Path("/dev/null"))
    with pytest.raises(BackendError):
        gpu.pin(714000000)


def test_nearest_level_never_goes_below_the_ask():
    levels = tree.JP5_LEVELS_HZ
    assert nearest_level(levels, 510000000) == 522750000
    assert nearest_level(levels, 114750000) == 114750000
    assert nearest_level(levels, 2_000_000_000) == 1300500000
