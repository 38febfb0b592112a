"""`ftgov characterize --model-dir`, the real-hardware path, run end to end on CPU against a simulated Orin sysfs tree.

A tiny BERT (and a tiny GPT-NeoX, Pythia's architecture) with random weights and a tokenizer built here, a synthetic
local GLUE copy in GLUE's own TSV layout; the devfreq backend pins the fake tree's files and the INA3221 rails are
read from it. The rails are static (no simulated board attached), so energy must equal their power times the measured
duration. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from governor.backends.devfreq import probe  # noqa: E402
from governor.backends.rails import AGX_ORIN_RAILS, ENERGY_RAILS, discover  # noqa: E402
from governor.errors import FtgovError  # noqa: E402
from governor.pipeline import characterize as ch  # noqa: E402
from governor.pipeline.hf_runner import HfTask, HfTrainingRunner  # noqa: E402
from governor.sim import tree  # noqa: E402

WORDS = ["good", "bad", "movie", "plot", "actor", "great", "awful", "fun", "dull", "story", "the", "a", "was", "very",
         "not", "really", "film", "scene", "music", "ending"]
RAILS_MW = {"VDD_GPU_SOC": 5400.0, "VDD_CPU_CV": 1300.0, "VIN_SYS_5V0": 4100.0, "VDDQ_VDD2_1V8AO": 700.0}
LEVELS_HZ = (510000000, 816000000, 1300500000)
PROV = ch.Provenance("measured", "jetson", 0)


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


@pytest.fixture
def board(tmp_path):
    """A JetPack 6 tree trimmed to three levels (the sweep's length, not its logic, depends on the table)."""
    root = tree.build(tmp_path / "sys-root", "jp6")
    gpu = probe(root)[0]
    (gpu.node / "available_frequencies").write_text(" ".join(map(str, LEVELS_HZ)) + "\n")
    (gpu.node / "min_freq").write_text(f"{LEVELS_HZ[0]}\n")
    (gpu.node / "max_freq").write_text(f"{LEVELS_HZ[-1]}\n")
    tree.write_rails(root, RAILS_MW)
    return root


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    """SST-2 and RTE in GLUE's original layout: <task dir>/train.tsv with GLUE's header and label values."""
    base = tmp_path_factory.mktemp("glue_data")
    sst2 = base / "SST-2"
    sst2.mkdir()
    rows = ["sentence\tlabel"] + [f"{s}\t{i % 2}" for i, s in enumerate(sentences(64))]
    (sst2 / "train.tsv").write_text("\n".join(rows) + "\n")
    rte = base / "RTE"
    rte.mkdir()
    pairs = zip(sentences(48, 1), sentences(48, 2), strict=False)
    rows = ["index\tsentence1\tsentence2\tlabel"] + [
        f"{i}\t{a}\t{b}\t{'entailment' if i % 3 else 'not_entailment'}" for i, (a, b) in enumerate(pairs)]
    (rte / "train.tsv").write_text("\n".join(rows) + "\n")
    return base


def word_vocab(path) -> None:
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny-bert")
    word_vocab(d / "vocab.txt")
    BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(d)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertForSequenceClassification(config).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_pythia(tmp_path_factory):
    """GPT-NeoX (Pythia's architecture) with a word-level tokenizer that, like Pythia's, has no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPTNeoXConfig, GPTNeoXForSequenceClassification, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny-pythia")
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="[UNK]")
    assert hf_tok.pad_token is None
    hf_tok.save_pretrained(d)
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=128, eos_token_id=0, bos_token_id=0)
    GPTNeoXForSequenceClassification(config).save_pretrained(d)
    return d


def read_rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def limits(gpu) -> tuple[int, int]:
    return int((gpu.node / "min_freq").read_text()), int((gpu.node / "max_freq").read_text())


class Watch:
    """on_step hook: the devfreq files as they read during each measured step, and an optional fault."""

    def __init__(self, gpu, fail_at: int | None = None, exc: type[BaseException] = RuntimeError):
        self.gpu, self.fail_at, self.exc = gpu, fail_at, exc
        self.seen: list[tuple[int, int]] = []
        self.times_s: list[float] = []

    def __call__(self, step: int) -> None:
        self.times_s.append(time.monotonic())
        self.seen.append(limits(self.gpu))
        if self.fail_at is not None and len(self.seen) == self.fail_at:
            raise self.exc("fault injected mid-measurement")


def job_for(model_dir, glue, board, watch, task="sst2", task_dir="SST-2"):
    gpu, rails = watch.gpu, discover(board)
    return ch.hf_job(model_dir, task, glue / task_dir, gpu, rails, batch_size=8, device="cpu", on_step=watch)


def check_rows(got, job, steps):
    assert [r["freq_hz"] for r in got] == [""] + [str(f) for f in LEVELS_HZ]
    assert [r["setting"] for r in got] == ["maxn"] + ["pinned"] * len(LEVELS_HZ)
    for r in got:
        assert r["workload"] == job.workload and r["source"] == "measured" and int(r["steps"]) == steps
        for rail in AGX_ORIN_RAILS:  # every rail named, at the power the files hold
            assert float(r[f"{rail}_mw"]) == pytest.approx(RAILS_MW[rail], rel=1e-6)
        power_w = sum(RAILS_MW[rail] for rail in ENERGY_RAILS) / 1e3
        assert float(r["duration_s"]) > 0
        assert float(r["energy_j"]) == pytest.approx(power_w * float(r["duration_s"]), rel=1e-5)
        assert float(r["energy_per_step_j"]) == pytest.approx(float(r["energy_j"]) / steps, rel=1e-5)
        assert r["energy_rails"] == "+".join(ENERGY_RAILS)


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_pythia"])
def test_every_level_is_pinned_while_measured_and_the_baseline_comes_back(request, tmp_path, board, glue, model):
    model_dir = request.getfixturevalue(model)
    gpu = probe(board)[0]
    baseline = limits(gpu)
    watch = Watch(gpu)
    job = job_for(model_dir, glue, board, watch)
    out = tmp_path / "c.csv"
    steps = 3
    start_s = time.monotonic()
    assert ch.characterize([job], gpu, out, steps, 1, PROV, progress=False) == 1 + len(LEVELS_HZ)
    wall_s = time.monotonic() - start_s
    got = read_rows(out)
    check_rows(got, job, steps)
    # duration_s is the measured span: it contains every measured step (seen from inside) and fits in the wall time.
    for i, r in enumerate(got):
        inside_s = watch.times_s[(i + 1) * steps - 1] - watch.times_s[i * steps]
        assert inside_s < float(r["duration_s"])
    assert sum(float(r["duration_s"]) for r in got) < wall_s
    # During each measurement the files held that setting's limits: the baseline for MAXN, then min = max = level.
    assert watch.seen == [baseline] * steps + [(f, f) for f in LEVELS_HZ for _ in range(steps)]
    assert limits(gpu) == baseline
    expected_type = "encoder" if model == "tiny_bert" else "decoder"
    assert (got[0]["model_type"], got[0]["num_layers"], got[0]["hidden_size"]) == (expected_type, "2", "32")
    assert 3 <= float(got[0]["seq_len"]) <= 14  # 3..12 words, plus [CLS]/[SEP] for BERT


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_a_fault_mid_measurement_restores_the_gpu_and_the_run_resumes(tmp_path, board, glue, tiny_bert, exc):
    gpu = probe(board)[0]
    baseline = limits(gpu)
    steps = 2
    watch = Watch(gpu, fail_at=2 * steps + 1, exc=exc)  # the first step at the second level
    out = tmp_path / "c.csv"
    with pytest.raises(exc, match="fault injected"):
        ch.characterize([job_for(tiny_bert, glue, board, watch)], gpu, out, steps, 0, PROV, progress=False)
    assert watch.seen[-1] == (LEVELS_HZ[1], LEVELS_HZ[1])  # it failed while pinned...
    assert limits(gpu) == baseline  # ...and the pin did not outlive the run
    assert [r["freq_hz"] for r in read_rows(out)] == ["", str(LEVELS_HZ[0])]

    job = job_for(tiny_bert, glue, board, Watch(gpu))
    assert ch.characterize([job], gpu, out, steps, 0, PROV, progress=False) == len(LEVELS_HZ) - 1
    check_rows(read_rows(out), job, steps)
    assert limits(gpu) == baseline


def test_sigterm_mid_measurement_restores_the_gpu(tmp_path, board, glue, tiny_bert):
    gpu = probe(board)[0]
    baseline = limits(gpu)
    seen = []

    def kill_at_second_level(step: int) -> None:
        seen.append(limits(gpu))
        if len(seen) == 3:  # MAXN took 2 steps; this is the first step at the first level
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    job = ch.hf_job(tiny_bert, "sst2", glue / "SST-2", gpu, discover(board), batch_size=8, device="cpu",
                    on_step=kill_at_second_level)
    with pytest.raises(ch.Terminated), ch.sigterm_raises():
        ch.characterize([job], gpu, tmp_path / "c.csv", 2, 0, PROV, progress=False)
    assert seen[-1] == (LEVELS_HZ[0], LEVELS_HZ[0]) and limits(gpu) == baseline
    assert signal.getsignal(signal.SIGTERM) is before


def test_limits_moved_by_someone_else_during_a_measurement_are_refused(board, glue, tiny_bert):
    gpu = probe(board)[0]
    baseline = gpu.snapshot()

    def intruder(step: int) -> None:  # another governor (ftgovd, jetson_clocks) writing the files while we measure
        if step == 1:
            # in one step, as the kernel's attribute changes: the sampler reads the file meanwhile, and a plain write
            # can show it truncated and empty (a fresh-clone CI saw "max_freq holds ''")
            tree.replace_file(board, gpu.node / "max_freq", f"{LEVELS_HZ[-1]}\n")

    # The sampler's last sample is taken after the last step, so it sees the change whatever its interval.
    runner = HfTrainingRunner(tiny_bert, HfTask("sst2", glue / "SST-2"), gpu, discover(board), batch_size=8,
                              device="cpu", on_step=intruder)
    gpu.pin(LEVELS_HZ[0])
    try:
        with pytest.raises(FtgovError, match="limits changed during the measurement"):
            runner.run(3)
    finally:
        gpu.restore(baseline)


def test_a_pickled_checkpoint_is_refused_with_how_to_convert_it(tmp_path, glue, tiny_bert, board):
    """characterize runs as root: weights come from safetensors only, never unpickled from pytorch_model.bin (which can
    run code as it loads on the transformers and torch of a JetPack board)."""
    import shutil

    from safetensors.torch import load_file

    pickled = tmp_path / "pickled-bert"
    shutil.copytree(tiny_bert, pickled)
    weights = pickled / "model.safetensors"
    torch.save(load_file(weights), pickled / "pytorch_model.bin")
    weights.unlink()
    with pytest.raises(FtgovError, match=r"no \.safetensors weights.*pytorch_model\.bin.*save_pretrained") as e:
        HfTrainingRunner(pickled, HfTask("sst2", glue / "SST-2"), probe(board)[0], discover(board), batch_size=8,
                         device="cpu")
    assert str(pickled) in str(e.value)


def parse(argv):
    parser = argparse.ArgumentParser()
    ch.add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def test_command_line_on_a_simulated_tree_writes_rows_and_sidecar(tmp_path, board, glue, tiny_bert):
    out = tmp_path / "hw.csv"
    args = parse(["characterize", "--model-dir", str(tiny_bert), "--model-name", "bert-tiny", "--task", "rte",
                  "--task-dir", str(glue / "RTE"), "--sysfs-root", str(board.root), "--device", "cpu",
                  "--batch-size", "4", "--steps", "2", "--warmup", "1", "--out", str(out), "--quiet"])
    gpu = probe(board)[0]
    baseline = limits(gpu)
    assert args.func(args) == 0
    got = read_rows(out)
    assert {r["workload"] for r in got} == {"bert-tiny/rte"} and len(got) == 1 + len(LEVELS_HZ)
    assert limits(gpu) == baseline
    meta = json.loads((tmp_path / "hw.csv.meta.json").read_text())
    assert meta["source"] == "measured" and meta["board"] == "NVIDIA Jetson AGX Orin Developer Kit"
    assert meta["levels_hz"] == list(LEVELS_HZ) and meta["device"] == "cpu"


def test_command_line_refuses_a_board_left_pinned(tmp_path, board, glue, tiny_bert):
    gpu = probe(board)[0]
    gpu.pin(LEVELS_HZ[1])  # what a SIGKILLed run or jetson_clocks leaves behind
    args = parse(["characterize", "--model-dir", str(tiny_bert), "--task", "sst2", "--task-dir", str(glue / "SST-2"),
                  "--sysfs-root", str(board.root), "--device", "cpu", "--out", str(tmp_path / "x.csv")])
    with pytest.raises(FtgovError, match="pinned at 816000000 Hz already"):
        args.func(args)
    assert not (tmp_path / "x.csv").exists()


def test_command_line_refuses_a_board_under_a_power_mode_cap(tmp_path, board, glue, tiny_bert):
    """AGX Orin's default power mode (MODE_30W) caps max_freq at 612 MHz: a maxn row measured there would be that
    mode's, labelled as MAXN's."""
    gpu = probe(board)[0]
    (gpu.node / "max_freq").write_text(f"{LEVELS_HZ[1]}\n")  # what nvpmodel leaves in a capped mode
    args = parse(["characterize", "--model-dir", str(tiny_bert), "--task", "sst2", "--task-dir", str(glue / "SST-2"),
                  "--sysfs-root", str(board.root), "--device", "cpu", "--out", str(tmp_path / "x.csv")])
    with pytest.raises(FtgovError, match="capped at 816000000 Hz"):
        args.func(args)
    assert not (tmp_path / "x.csv").exists()
    assert limits(gpu) == (LEVELS_HZ[0], LEVELS_HZ[1])


def test_glue_tsv_layouts_are_read_with_their_label_names(tmp_path):
    mnli = tmp_path / "MNLI"
    mnli.mkdir()
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label"
    rows = [header, "0\t1\t1e\tfiction\tA man \"sleeps\".\tA person rests.\tentailment\tentailment",
            "1\t2\t2n\tfiction\tA dog.\tA cat.\tneutral\tcontradiction", "2\t3\tragged row"]
    (mnli / "train.tsv").write_text("\n".join(rows) + "\n")
    got = HfTask("mnli", mnli).load_train()
    assert [(e.texts, e.label) for e in got] == [(('A man "sleeps".', "A person rests."), 0),
                                                 (("A dog.", "A cat."), 2)]
    cola = tmp_path / "CoLA"
    cola.mkdir()
    (cola / "train.tsv").write_text("gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n")
    assert [(e.texts, e.label) for e in HfTask("cola", cola).load_train()] == [
        (("Our friends won't buy this.",), 1), (("They drank the pub.",), 0)]
    stsb = tmp_path / "STS-B"
    stsb.mkdir()
    (stsb / "train.jsonl").write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": 3.8}) + "\n")
    assert [(e.texts, e.label) for e in HfTask("stsb", stsb).load_train()] == [(("a", "b"), 3.8)]


def test_glue_reader_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(FtgovError, match="unknown GLUE task"):
        HfTask("squad", tmp_path).load_train()
    with pytest.raises(FtgovError, match="expected .*train.tsv"):
        HfTask("sst2", tmp_path).load_train()
    (tmp_path / "train.tsv").write_text("text\ttarget\nhello\t1\n")
    with pytest.raises(FtgovError, match="names neither"):
        HfTask("sst2", tmp_path).load_train()
    (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(FtgovError, match="label 'maybe'"):
        HfTask("rte", tmp_path).load_train()
