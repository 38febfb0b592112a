"""The shipped model files: where the daemon finds them, the one ffg.json reader and its fallback, the MHz formatter."""

from __future__ import annotations

import json
import os

import pytest

from governor import data
from governor.config import FALLBACK_FFG_HZ, default_ffg_hz, default_model_path
from governor.errors import ModelError
from governor.policy.ffg import read_ffg_hz
from governor.policy.tree import DecisionTree
from governor.units import mhz
from tests.support import REPO


def test_the_daemons_default_model_is_the_packages_trained_tree():
    path = default_model_path()
    assert path == REPO / "governor" / "data" / "mlg-tree.json"
    assert DecisionTree.load(path).source == "trained"
    assert default_ffg_hz(path) == (read_ffg_hz(data.path(data.FFG)), str(data.path(data.FFG)))


def test_model_dir_links_to_the_shipped_files():
    # One source of truth: model/'s names (docs, configs, other tools) resolve to the package data.
    for name in (data.MLG_TREE, data.FFG, data.PAPER_TREE):
        assert (REPO / "model" / name).resolve() == data.path(name).resolve()


@pytest.mark.parametrize("content, fault", [
    (None, "No such file"),
    ("{", "not JSON"),
    ('{"freq_hz": 0}', "positive integer"),
    ('{"freq_hz": true}', "positive integer"),
    ('{"freq_hz": 816.0}', "positive integer"),
    ("[816000000]", "positive integer"),
    ('{"freq_hz": 816}', "no GPU clock in Hz"),  # MHz: it would pin every job at the lowest level
    ('{"freq_hz": 816000000000}', "no GPU clock in Hz"),
])
def test_a_bad_ffg_file_is_refused_with_its_name_and_fault(tmp_path, content, fault):
    path = tmp_path / "ffg.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelError, match=fault) as e:
        read_ffg_hz(path)
    assert str(path) in str(e.value)



def test_a_fifo_in_place_of_ffg_json_is_refused_not_waited_on(tmp_path):
    # The daemon reads it as root at start and on reload: a FIFO must not hang it.
    path = tmp_path / "ffg.json"
    os.mkfifo(path)
    with pytest.raises(ModelError, match="not a regular file"):
        read_ffg_hz(path)

def test_the_daemon_falls_back_with_the_readers_reason(tmp_path):
    (tmp_path / "ffg.json").write_text(json.dumps({"freq_hz": -1}))
    hz, source = default_ffg_hz(tmp_path / "mlg-tree.json")
    assert hz == FALLBACK_FFG_HZ
    assert source.startswith("built-in fallback") and "positive integer" in source and str(tmp_path) in source


def test_mhz():
    assert mhz(714_000_000) == "714 MHz"
    assert mhz(1_300_500_000) == "1300.5 MHz"
    assert mhz(None) == "-"
    assert mhz(None, none="maxn", unit=False) == "maxn"
    assert mhz(612_000_000, unit=False) == "612"
