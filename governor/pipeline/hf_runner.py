"""The real workload for characterization on a Jetson: a Hugging Face fine-tuning loop, measured from the rails.

UNTESTED ON A JETSON. The loop, the GLUE reader, the rail sampling and the pinning run in the test suite on CPU against
a simulated Orin sysfs tree (tests/pipeline/test_hf_runner.py); the CUDA parts (fp16 autocast, the gradient scaler,
torch.cuda.synchronize) and the real INA3221/devfreq files have never run on a board. Treat its first run there as a
test.

The GLUE copy is read with the standard library, in the layout of GLUE's own distribution (one directory per task,
``train.tsv`` as written by the GLUE download script), or as ``train.jsonl`` with the Hugging Face ``glue`` columns.
No ``datasets`` package: a local copy is a few TSV files, and the board should not need another dependency for them.

torch and transformers are imported inside the functions that need them: importing this module costs nothing, and
the simulated path never touches them.
"""

from __future__ import annotations

import csv
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from governor.errors import FtgovError
from governor.pipeline.measure import SettingMeasurement


@dataclass(frozen=True)
class GlueFormat:
    """Where a task's text and label live in its train file, in both layouts."""

    text_columns: tuple[str, ...]  # Hugging Face `glue` names (train.jsonl; also accepted as a TSV header)
    tsv_text_columns: tuple[str, ...]  # the header of GLUE's original train.tsv
    tsv_label_column: str
    label_names: tuple[str, ...] = ()  # string labels in the order of their ids (the Hugging Face ClassLabel order)
    regression: bool = False

    @property
    def num_labels(self) -> int:
        return 1 if self.regression else max(2, len(self.label_names))


GLUE_FORMATS: dict[str, GlueFormat] = {
    "sst2": GlueFormat(("sentence",), ("sentence",), "label"),
    "cola": GlueFormat(("sentence",), ("sentence",), "label"),
    "qnli": GlueFormat(("question", "sentence"), ("question", "sentence"), "label", ("entailment", "not_entailment")),
    "mrpc": GlueFormat(("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality"),
    "rte": GlueFormat(("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                      ("entailment", "not_entailment")),
    "wnli": GlueFormat(("sentence1", "sentence2"), ("sentence1", "sentence2"), "label"),
    "stsb": GlueFormat(("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", regression=True),
    "qqp": GlueFormat(("question1", "question2"), ("question1", "question2"), "is_duplicate"),
    "mnli": GlueFormat(("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
                       ("entailment", "neutral", "contradiction")),
}
# GLUE's CoLA train.tsv has no header: source, label, the original annotation, sentence.
COLA_HEADERLESS = ("source", "label", "label_notes", "sentence")


@dataclass(frozen=True)
class Example:
    texts: tuple[str, ...]
    label: float | int


class RailSampler:
    """Samples rail power and the GPU's state on a thread while a measurement runs, integrating power over time.

    A sampler, not a wait: it must look at the rails at a fixed rate because the INA3221 only reports instantaneous
    power (the driver refreshes every update_interval, 140 ms in the simulated tree, unverified on a board). Each
    interval between two samples is integrated at the mean of its end points (trapezoid rule). It also records every
    (min_hz, max_hz) it saw, so that a measurement during which something else moved the limits can be refused.
    """

    def __init__(self, rails, gpu, interval_s: float = 0.05):
        self.rails = rails
        self.gpu = gpu
        self.interval_s = interval_s
        self.measurement = SettingMeasurement.start()
        self.limits_seen: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> RailSampler:
        # The first sample is taken here, on the caller's thread, so the measured span starts before the first step.
        self._first = self._sample()
        self._thread = threading.Thread(target=self._run, name="rail-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive() and exc[0] is None:
                raise FtgovError("rail sampler did not stop within 5 s: the measurement is incomplete")
        if self._error is not None and exc[0] is None:
            raise FtgovError(f"rail sampling failed: {self._error}") from self._error

    def _sample(self) -> tuple[float, dict[str, float], float | None, float | None]:
        reading = self.gpu.read()
        self.limits_seen.add((reading.min_hz, reading.max_hz))
        return time.monotonic(), self.rails.read_mw(), reading.load_pct, reading.cur_hz

    def _run(self) -> None:
        try:
            prev = self._first
            while True:
                stopping = self._stop.wait(self.interval_s)
                cur = self._sample()
                rails = {r: (prev[1][r] + cur[1].get(r, prev[1][r])) / 2 for r in prev[1]}
                self.measurement.add_interval(cur[0] - prev[0], rails, cur[2], cur[3])
                prev = cur
                if stopping:
                    return
        except BaseException as e:  # reported by __exit__ on the caller's thread
            self._error = e


@dataclass
class HfTask:
    """A GLUE task read from a local copy: ``<path>/train.tsv`` (GLUE's layout) or ``<path>/train.jsonl``."""

    name: str
    path: Path

    @property
    def format(self) -> GlueFormat:
        try:
            return GLUE_FORMATS[self.name]
        except KeyError:
            raise FtgovError(f"unknown GLUE task {self.name!r}; known: {sorted(GLUE_FORMATS)}") from None

    def load_train(self) -> list[Example]:
        fmt = self.format  # an unknown task fails before any file is opened
        tsv, jsonl = self.path / "train.tsv", self.path / "train.jsonl"
        try:
            if tsv.exists():
                examples = self._read_tsv(tsv, fmt)
            elif jsonl.exists():
                examples = self._read_jsonl(jsonl, fmt)
            else:
                raise FtgovError(f"no GLUE data for {self.name}: expected {tsv} or {jsonl}")
        except OSError as e:
            raise FtgovError(f"cannot read the GLUE copy under {self.path}: {e.strerror or e}") from e
        if not examples:
            raise FtgovError(f"{self.path}: no usable training examples")
        return examples

    def _label(self, value, fmt: GlueFormat, where: str) -> float | int:
        try:
            if fmt.regression:
                return float(value)
            if isinstance(value, str) and value in fmt.label_names:
                return fmt.label_names.index(value)
            return int(value)
        except (TypeError, ValueError):
            raise FtgovError(f"{where}: label {value!r} is not one of {fmt.label_names or 'the integer ids'}") from None

    def _read_tsv(self, path: Path, fmt: GlueFormat) -> list[Example]:
        # QUOTE_NONE: GLUE's TSVs carry bare quote characters inside sentences.
        with path.open(newline="", encoding="utf-8") as f:
            rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            first = next(rows, None)
            if first is None:
                return []
            if self.name == "cola" and "sentence" not in first:
                header, body = list(COLA_HEADERLESS), [first, *rows]
            else:
                header, body = first, rows
            index = {name: i for i, name in enumerate(header)}
            if all(c in index for c in fmt.tsv_text_columns) and fmt.tsv_label_column in index:
                text_cols, label_col = fmt.tsv_text_columns, fmt.tsv_label_column
            elif all(c in index for c in fmt.text_columns) and "label" in index:
                text_cols, label_col = fmt.text_columns, "label"
            else:
                raise FtgovError(f"{path}: header {header} names neither GLUE's columns {fmt.tsv_text_columns} + "
                                 f"{fmt.tsv_label_column!r} nor {fmt.text_columns} + 'label'")
            wanted = [index[c] for c in text_cols] + [index[label_col]]
            examples = []
            for line, row in enumerate(body, start=2 if body is rows else 1):
                # A few rows of GLUE's larger TSVs are ragged or unlabelled (test-style rows): skipped, not guessed.
                if len(row) <= max(wanted) or not row[index[label_col]]:
                    continue
                examples.append(Example(tuple(row[index[c]] for c in text_cols),
                                        self._label(row[index[label_col]], fmt, f"{path}:{line}")))
        return examples

    def _read_jsonl(self, path: Path, fmt: GlueFormat) -> list[Example]:
        examples = []
        with path.open(encoding="utf-8") as f:
            for line, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                    texts = tuple(str(obj[c]) for c in fmt.text_columns)
                    label = obj["label"]
                except (ValueError, KeyError, TypeError) as e:
                    raise FtgovError(f"{path}:{line}: not a JSON object with {fmt.text_columns} and 'label' "
                                     f"({e})") from None
                examples.append(Example(texts, self._label(label, fmt, f"{path}:{line}")))
        return examples


class HfTrainingRunner:
    """Fine-tunes a local BERT/Pythia checkpoint on a local GLUE task, one optimizer step per `run` step.

    On CUDA: fp16 autocast with a gradient scaler, AdamW, dynamic padding (the setup the energy model assumes). On CPU
    (tests, or a dry run of the pipeline off the board) the same loop in fp32.
    ``on_step(i)`` is called after each measured step (i from 0), on the training thread: a progress hook, and the
    place a test looks at the pinned limits from inside a measurement.
    """

    def __init__(self, model_dir: Path, task: HfTask, gpu, rails, batch_size: int = 32, lr: float = 2e-5,
                 seed: int = 0, max_len: int = 128, max_samples: int = 20000, device: str = "cuda",
                 sample_interval_s: float = 0.05, on_step: Callable[[int], None] | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise FtgovError("CUDA is not available: the real characterization needs the Jetson's GPU "
                             "(--device cpu runs the loop on the CPU, for a dry run)")
        fmt = task.format
        examples = task.load_train()
        torch.manual_seed(seed)
        self.gpu, self.rails, self.batch_size = gpu, rails, batch_size
        self.sample_interval_s, self.on_step = sample_interval_s, on_step
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            if self.tokenizer.pad_token is None:  # Pythia ships without one
                self.tokenizer.pad_token = self.tokenizer.eos_token
            # Weights from safetensors only: characterize runs as root on a board, and a pickled checkpoint
            # (pytorch_model.bin) can run code as it loads where torch.load's weights_only is not enforced
            # (CVE-2025-32434: transformers 4.40-4.49 with torch < 2.6, which JetPack's wheels are).
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model_dir, local_files_only=True, use_safetensors=True, num_labels=fmt.num_labels).to(self.device)
        except OSError as e:  # transformers reports a missing or unreadable checkpoint as OSError
            hint = ""
            if not any(Path(model_dir).glob("*.safetensors")):
                hint = (" (it has no .safetensors weights: characterize loads no pickled checkpoint such as "
                        "pytorch_model.bin, which can run code as it loads; convert it as its owner, not as root: "
                        "python -c 'import sys, transformers as t; m = t.AutoModel.from_pretrained(sys.argv[1]); "
                        f"m.save_pretrained(sys.argv[1], safe_serialization=True)' {model_dir})")
            raise FtgovError(f"cannot load a Hugging Face model from {model_dir}: {e}{hint}") from e
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        # Characterization needs steps x settings x batch samples, not a whole epoch of QQP or MNLI: tokenize a
        # seeded sample. seq_len (a feature of the tree) is the mean over that sample.
        random.Random(seed).shuffle(examples)
        examples = examples[:max_samples]
        encoded = self.tokenizer([e.texts[0] for e in examples],
                                 *([[e.texts[1] for e in examples]] if len(fmt.text_columns) > 1 else []),
                                 truncation=True, max_length=max_len)
        features = [{k: v[i] for k, v in encoded.items()} | {"labels": examples[i].label}
                    for i in range(len(examples))]
        self.seq_len = sum(len(f["input_ids"]) for f in features) / len(features)
        self.loader = torch.utils.data.DataLoader(features, batch_size=batch_size, shuffle=True,
                                                  generator=torch.Generator().manual_seed(seed),
                                                  collate_fn=DataCollatorWithPadding(self.tokenizer))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.amp = self.device.type == "cuda"
        # torch >= 2.3 for torch.amp.GradScaler (JetPack 6 wheels are 2.3+).
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None
        self._batches = iter(())

    def _next_batch(self):
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            return next(self._batches)

    def _step(self) -> None:
        import torch

        batch = {k: v.to(self.device, non_blocking=True) for k, v in self._next_batch().items()}
        if self.amp:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = self.model(**batch).loss
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.model(**batch).loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _sync(self) -> None:
        """Wait for the GPU: kernels are queued asynchronously, and the measured span must contain them all."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def run(self, steps: int, warmup: int = 0) -> SettingMeasurement:
        self.model.train()
        for _ in range(warmup):
            self._step()
        self._sync()
        with RailSampler(self.rails, self.gpu, self.sample_interval_s) as sampler:
            for i in range(steps):
                self._step()
                if self.on_step is not None:
                    self.on_step(i)
            self._sync()
        if len(sampler.limits_seen) != 1:
            # Something else (ftgovd, nvpmodel, jetson_clocks) moved the GPU's limits while we measured.
            raise FtgovError(f"the GPU's limits changed during the measurement: {sorted(sampler.limits_seen)}; "
                             f"stop other governors (ftgovd, jetson_clocks) while characterizing")
        sampler.measurement.steps = steps
        return sampler.measurement
