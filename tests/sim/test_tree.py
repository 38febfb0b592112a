"""The simulated trees have the board's layout (JetPack 5 and 6 links, INA3221 unused channels), discovery handles
each, the energy sum is chosen per board, and the simulator keeps one copy of its tables and conversions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from governor.backends import devfreq, rails
from governor.backends.base import Limits
from governor.features import Features
from governor.sim import energy, tree
from governor.sysfs import Root


def target(root: Root, link: str) -> str:
    return root.unroot(root.resolve(root.path(link)))


def test_jetpack6_links(tmp_path):
    root = tree.build(tmp_path, "jp6")
    device = "/sys/devices/platform/bus@0/17000000.gpu"
    for link in ("/sys/devices/platform/bus@0/gpu.0", "/sys/devices/platform/gpu.0",
                 "/sys/devices/platform/17000000.gpu"):
        assert target(root, link) == device, link
    assert target(root, device + "/devfreq_dev") == device + "/devfreq/17000000.gpu"
    assert target(root, "/sys/class/devfreq/17000000.gpu") == device + "/devfreq/17000000.gpu"
    assert not root.path("/sys/devices/gpu.0").exists(), "JetPack 6 has no /sys/devices/gpu.0"
    assert (root.path(device) / "of_node/name").read_bytes() == b"gpu\0"


def test_jetpack5_links_and_the_node_under_platform(tmp_path):
    root = tree.build(tmp_path, "jp5")
    device = "/sys/devices/platform/17000000.ga10b"
    for link in ("/sys/devices/17000000.ga10b", "/sys/devices/gpu.0", "/sys/devices/platform/gpu.0"):
        assert target(root, link) == device, link
    assert not root.path("/sys/devices/platform/bus@0/gpu.0").exists()
    (gpu,) = devfreq.probe(root)
    # Found through the class link, the node is the one under /sys/devices/platform (where every write lands),
    # not the driver's link one level up.
    assert root.unroot(gpu.node) == device + "/devfreq/17000000.ga10b"
    assert root.unroot(gpu.load_path) == device + "/load"
    # The reference lists devfreq_dev for JetPack 6 only; and a device-tree platform device is named
    # unit-address.node-name, so 17000000.ga10b's node is ga10b@17000000, whose name reads ga10b.
    assert not (root.path(device) / "devfreq_dev").exists() and not (root.path(device) / "devfreq_dev").is_symlink()
    assert target(root, device + "/of_node") == "/proc/device-tree/ga10b@17000000"


@pytest.mark.parametrize("layout", ["jp6", "jp5"])
def test_the_nvpmodel_conf_names_limit_files_the_tree_has(tmp_path, layout):
    """nvpmodel writes the files its conf names, through the driver's links: each must lead to the GPU's node."""
    root = tree.build(tmp_path, layout, power_mode=2)
    (gpu,) = devfreq.probe(root)
    named = [line.split()[1] for line in root.path(tree.NVPMODEL_CONF).read_text().splitlines()
             if line.startswith(("MIN_FREQ /", "MAX_FREQ /"))]
    assert len(named) == 2
    for path in named:
        assert root.resolve(root.path(path)) == gpu.node / Path(path).name, path


def labels(root: Root) -> dict[str, dict[str, str | None]]:
    out = {}
    for chip in sorted(os.listdir(root.path("/sys/bus/i2c/drivers/ina3221"))):
        (hwmon,) = (root.path("/sys/bus/i2c/drivers/ina3221") / chip / "hwmon").iterdir()
        out[chip] = {}
        for ch in (1, 2, 3):
            label = hwmon / f"in{ch}_label"
            out[chip][ch] = label.read_text().strip() if label.exists() else None
    return out


def test_unused_channels_jetpack5_labels_nc_jetpack6_has_no_label(tmp_path):
    jp5, jp6 = tree.build(tmp_path / "5", "jp5"), tree.build(tmp_path / "6", "jp6")
    agx = {"1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"}}
    assert labels(jp5) == {**agx, "1-0041": {1: "NC", 2: "VDDQ_VDD2_1V8AO", 3: "NC"}}
    assert labels(jp6) == {**agx, "1-0041": {1: None, 2: "VDDQ_VDD2_1V8AO", 3: None}}
    for root in (jp5, jp6):
        found = rails.discover(root)
        assert found.names == sorted(rails.AGX_ORIN_RAILS), "NC and label-less channels are skipped"
        assert found.read_mw()["VIN_SYS_5V0"] > 0, "no unused channel's input is read (they fail on JetPack 6)"


def test_the_energy_sum_is_chosen_per_board(tmp_path):
    agx = rails.discover(tree.build(tmp_path / "agx", "jp6"))
    assert agx.energy_rails == list(rails.AGX_ENERGY_RAILS)
    assert "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0" in agx.describe_energy()
    nx_root = tree.build(tmp_path / "nx", "nx-jp6")
    nx = rails.discover(nx_root)
    assert nx.names == sorted(rails.NX_ORIN_RAILS)
    assert nx.energy_rails == ["VDD_IN"], "VDD_IN is the total: never added to the other two"
    assert nx.total_mw(nx.read_mw()) == pytest.approx(nx.read_mw()["VDD_IN"])
    assert "VDD_IN" in nx.describe_energy() and "total input" in nx.describe_energy()
    # An NX whose VDD_IN channel is missing: no known sum, said so rather than a partial figure.
    (nx_root.root / "sys/class/hwmon/hwmon1/in1_label").unlink()
    partial = rails.discover(nx_root)
    assert partial.energy_rails == [] and "no known energy sum" in partial.describe_energy()


def test_each_board_has_its_table_and_a_power_mode_baseline(tmp_path):
    for layout, levels in (("jp6", tree.JP6_LEVELS_HZ), ("jp5", tree.JP5_LEVELS_HZ), ("nx-jp6", tree.NX_LEVELS_HZ)):
        (gpu,) = devfreq.probe(tree.build(tmp_path / layout, layout))
        assert gpu.levels_hz == levels
        assert gpu.snapshot() == Limits(levels[0], levels[-1])
    (capped,) = devfreq.probe(tree.build(tmp_path / "30w", "jp6", max_hz=612000000))
    assert capped.snapshot() == Limits(306000000, 612000000)
    (jp5_capped,) = devfreq.probe(tree.build(tmp_path / "jp5-30w", "jp5", max_hz=612000000))
    assert jp5_capped.snapshot().max_hz == 612000000, "a capped max need not be a level (JetPack 5)"
    with pytest.raises(ValueError, match="outside"):
        tree.build(tmp_path / "bad", "jp6", max_hz=2_000_000_000)
    with pytest.raises(ValueError, match="unknown layout"):
        tree.build(tmp_path / "bad", "jp4")


def test_one_level_table_and_one_features_to_workload_conversion():
    assert energy.JP6_LEVELS_HZ is tree.JP6_LEVELS_HZ
    assert energy.OrinEnergyModel().levels_hz == tree.JP6_LEVELS_HZ
    as_dict = {"model_type": "decoder", "num_layers": 6, "hidden_size": 512, "seq_len": 30.0, "gpu_util": 50.0}
    w = energy.workload_from_features(as_dict, "p")
    assert w == energy.workload_from_features(Features(**as_dict), "p")
    assert (w.name, w.model_type, w.num_layers, w.hidden_size, w.seq_len, w.batch_size) == \
        ("p", "decoder", 6, 512, 30.0, 32)


def test_the_nx_split_keeps_the_agx_total():
    model = energy.OrinEnergyModel()
    s = model.expected(energy.workload_from_features(
        {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0}, "b"), 816000000)
    nx = energy.nx_rails_mw(s.rails_mw)
    assert nx["VDD_IN"] == pytest.approx(s.power_mw)
    assert nx["VDD_CPU_GPU_CV"] + nx["VDD_SOC"] < nx["VDD_IN"], "the 5 V system rail's share is only in VDD_IN"


def test_a_power_mode_writes_nvpmodel_files_and_caps_the_baseline(tmp_path):
    root = tree.build(tmp_path / "30w", "jp6", power_mode=2)
    assert devfreq.probe(root)[0].snapshot() == Limits(306000000, 612000000)
    conf = root.path(tree.NVPMODEL_CONF).read_text()
    assert "< POWER_MODEL ID=2 NAME=MODE_30W >\nGPU MIN_FREQ 0\nGPU MAX_FREQ 612000000" in conf
    assert "< PM_CONFIG DEFAULT=2 >" in conf
    assert root.path(tree.NVPMODEL_STATUS).read_text().startswith("pmode:0002")
    maxn = tree.build(tmp_path / "maxn", "jp5", power_mode=0)
    assert devfreq.probe(maxn)[0].snapshot().max_hz == tree.JP5_LEVELS_HZ[-1]
    with pytest.raises(ValueError, match="AGX Orin"):
        tree.build(tmp_path / "nx", "nx-jp6", power_mode=2)
    with pytest.raises(ValueError, match="contradicts"):
        tree.build(tmp_path / "both", "jp6", power_mode=2, max_hz=816000000)
