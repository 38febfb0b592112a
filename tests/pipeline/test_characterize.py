"""`ftgov characterize` on the simulated Orin: rows, resumability, Ctrl-C restores the GPU, and the committed dataset
is what the code produces."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from governor.backends.rails import ENERGY_RAILS
from governor.errors import FtgovError
from governor.pipeline import characterize as ch
from governor.pipeline import dataset
from governor.pipeline.workloads import characterization_workloads, held_out_workloads
from governor.sim.energy import OrinEnergyModel
from governor.sim.gpu import SimulatedGpu
from tests.support import REPO

PROV = ch.Provenance("simulated", OrinEnergyModel.VERSION, 0)


def sweep(tmp_path, workloads, on_row=None, name="c.csv", steps=5):
    gpu = SimulatedGpu(OrinEnergyModel().levels_hz)
    out = tmp_path / name
    added = ch.characterize(ch.simulated_jobs(workloads, gpu, seed=0, noise=1.0), gpu, out, steps, 1, PROV,
                            on_row=on_row, progress=False)
    return gpu, out, added


def rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path, table):
    """The CSV again, with ``table``'s rows (a file put together or edited by hand)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(table)


def test_one_row_per_setting_with_named_rails_and_consistent_energy(tmp_path):
    workloads = characterization_workloads()[:2]
    _, out, added = sweep(tmp_path, workloads)
    got = rows(out)
    assert added == len(got) == 2 * 12
    for w in workloads:
        mine = [r for r in got if r["workload"] == w.name]
        assert [r["freq_hz"] for r in mine] == [""] + [str(f) for f in OrinEnergyModel().levels_hz]
        assert mine[0]["setting"] == "maxn" and all(r["setting"] == "pinned" for r in mine[1:])
    for r in got:
        rails_w = sum(float(r[f"{rail}_mw"]) for rail in ENERGY_RAILS) / 1e3
        assert float(r["energy_j"]) == pytest.approx(rails_w * float(r["duration_s"]), rel=1e-5)
        assert float(r["energy_per_step_j"]) == pytest.approx(float(r["energy_j"]) / int(r["steps"]), rel=1e-5)
        assert r["energy_rails"] == "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0"
        assert (r["source"], r["model_version"], r["seed"]) == ("simulated", OrinEnergyModel.VERSION, "0")
        assert 0 < float(r["gpu_util_pct"]) <= 100


def test_interrupted_run_restores_the_gpu_and_resumes_to_the_same_file(tmp_path):
    workloads = characterization_workloads()[:3]
    _, whole, _ = sweep(tmp_path, workloads, name="whole.csv")

    seen = []

    def interrupt_at_seven(row):
        seen.append(row)
        if len(seen) == 7:
            raise KeyboardInterrupt

    gpu = SimulatedGpu(OrinEnergyModel().levels_hz)
    baseline = gpu.snapshot()
    part = tmp_path / "part.csv"
    jobs = ch.simulated_jobs(workloads, gpu, seed=0, noise=1.0)
    with pytest.raises(KeyboardInterrupt):
        ch.characterize(jobs, gpu, part, 5, 1, PROV, on_row=interrupt_at_seven, progress=False)
    assert gpu.snapshot() == baseline and gpu.pinned_hz() is None  # the pin did not outlive the run
    assert len(rows(part)) == 7
    added = ch.characterize(jobs, gpu, part, 5, 1, PROV, progress=False)
    assert added == 3 * 12 - 7
    assert part.read_bytes() == whole.read_bytes()
    assert ch.characterize(jobs, gpu, part, 5, 1, PROV, progress=False) == 0


def test_refuses_to_append_to_a_csv_with_other_columns(tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    gpu = SimulatedGpu(OrinEnergyModel().levels_hz)
    with pytest.raises(FtgovError, match="different columns"):
        ch.characterize(ch.simulated_jobs(characterization_workloads()[:1], gpu, 0, 0.0), gpu, out, 2, 0, PROV,
                        progress=False)


def parse(argv):
    parser = argparse.ArgumentParser()
    ch.add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def test_command_line_writes_csv_and_sidecar(tmp_path):
    out = tmp_path / "x.csv"
    args = parse(["characterize", "--simulate", "--workload", "bert-base/rte", "--steps", "3", "--seed", "4",
                  "--out", str(out), "--quiet"])
    assert args.func(args) == 0
    assert {r["workload"] for r in rows(out)} == {"bert-base/rte"}
    meta = json.loads((tmp_path / "x.csv.meta.json").read_text())
    assert meta["source"] == "simulated" and meta["seed"] == 4 and meta["energy_model"] == OrinEnergyModel.VERSION


def test_command_line_refuses_unknown_workload(tmp_path):
    args = parse(["characterize", "--simulate", "--workload", "gpt-5/sst2", "--out", str(tmp_path / "y.csv")])
    with pytest.raises(FtgovError, match="unknown workload"):
        args.func(args)


@pytest.mark.parametrize("name,suite,seed,count", [("characterization.csv", "characterization", 0, 27),
                                                   ("held-out.csv", "held-out", 1, 60)])
def test_committed_dataset_is_what_characterize_produces(tmp_path, name, suite, seed, count):
    committed = REPO / "model" / "data" / name
    meta = json.loads(committed.with_name(name + ".meta.json").read_text())
    assert (meta["suite"], meta["seed"], meta["energy_model"]) == (suite, seed, OrinEnergyModel.VERSION)
    out = tmp_path / name
    args = parse(["characterize", "--simulate", "--suite", suite, "--seed", str(seed), "--steps",
                  str(meta["steps"]), "--warmup", str(meta["warmup_steps"]), "--noise", str(meta["noise"]),
                  "--out", str(out), "--quiet"])
    assert args.func(args) == 0
    assert out.read_bytes() == committed.read_bytes()
    assert len({r["workload"] for r in rows(out)}) == count


def test_held_out_set_covers_every_model_on_the_six_unseen_tasks():
    tasks = {w.name.split("/")[1] for w in held_out_workloads()}
    assert tasks == {"qqp", "rte", "cola", "stsb", "mnli", "wnli"}
    assert not tasks & {w.name.split("/")[1] for w in characterization_workloads()}


def cut_last_row_in(path, column):
    """The file as a characterization stopped while writing its last row leaves it: cut inside ``column``."""
    text = path.read_text().rstrip("\n")
    head, last = text.rsplit("\n", 1)
    fields = last.split(",")
    at = ch.COLUMNS.index(column)
    path.write_text(head + "\n" + ",".join(fields[:at] + [fields[at][:1]]))
    return fields[at][:1], fields[at]


def test_a_row_cut_short_is_refused_not_trained_on_nor_taken_as_measured(tmp_path):
    # energy_per_step_j cut to its first digit: every column the sweep reads is there, the ones after it are not.
    gpu, out, _ = sweep(tmp_path, characterization_workloads()[:2])
    cut, whole = cut_last_row_in(out, "energy_per_step_j")
    assert float(cut) != float(whole)
    lines = len(out.read_text().splitlines())
    with pytest.raises(FtgovError, match=f"line {lines} .*cut short"):
        dataset.load(out)
    with pytest.raises(FtgovError, match=f"line {lines} .*cut short"):  # a resume must not skip it as done
        ch.characterize(ch.simulated_jobs(characterization_workloads()[:2], gpu, 0, 1.0), gpu, out, 5, 1, PROV,
                        progress=False)


@pytest.mark.parametrize("prov,why", [(ch.Provenance("measured", "jetson", 0), "simulated orin-energy/1.0 seed 0"),
                                      (ch.Provenance("simulated", OrinEnergyModel.VERSION, 1), "simulated .* seed 0")])
def test_rows_of_another_source_or_simulated_run_are_not_appended(tmp_path, prov, why):
    # A board's measurements added to the shipped simulated CSV (the file `make model` reads) would be trained on with
    # its 27 simulated sweeps, and the sidecar, rewritten by the run, would call the whole file measured.
    gpu, out, _ = sweep(tmp_path, characterization_workloads()[:1])
    before = out.read_bytes()
    more = ch.simulated_jobs(characterization_workloads()[1:2], gpu, seed=0, noise=1.0)
    with pytest.raises(FtgovError, match=f"holds {why}.*another --out"):
        ch.characterize(more, gpu, out, 5, 1, prov, progress=False)
    assert out.read_bytes() == before


def test_a_csv_mixing_simulated_and_measured_rows_is_not_trained_on(tmp_path):
    _, out, _ = sweep(tmp_path, characterization_workloads()[:2])
    text = out.read_text().splitlines()
    measured = [line.replace(",simulated,", ",measured,") for line in text[13:]]  # the second workload's rows
    out.write_text("\n".join(text[:13] + measured) + "\n")
    with pytest.raises(FtgovError, match="mixes 12 measured rows and 12 simulated rows"):
        dataset.load(out)


def test_a_csv_with_levels_in_mhz_is_not_trained_on(tmp_path):
    # A CSV put together by hand with freq_hz in MHz trained and exported a tree of 612/714/816 "Hz" leaves and an
    # ffg.json of 816, which the daemon refuses (MLG then falls back to a built-in FFG level): refused where it is read.
    _, out, _ = sweep(tmp_path, characterization_workloads()[:2])
    table = rows(out)
    for r in table:
        r["freq_hz"] = r["freq_hz"] and str(int(r["freq_hz"]) // 1_000_000)
    write_rows(out, table)
    with pytest.raises(FtgovError, match=r"freq_hz 306 is not a GPU clock in Hz .*816 MHz is 816000000"):
        dataset.load(out)


@pytest.mark.parametrize("column", ["energy_per_step_j", "step_time_s"])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_row_whose_energy_or_time_is_no_positive_number_is_refused(tmp_path, column, value):
    # 'nan' in one pinned row's energy made `ffg` pick the lowest level (306 MHz) and `dataset` label on it; 0 or a
    # negative number ended `dataset` in a traceback (math domain error).
    _, out, _ = sweep(tmp_path, characterization_workloads()[:2])
    table = rows(out)
    table[1][column] = value
    write_rows(out, table)
    with pytest.raises(FtgovError, match=f"{table[1]['workload']}: {column} {value!r} at 306 MHz is not a positive"):
        dataset.load(out)
