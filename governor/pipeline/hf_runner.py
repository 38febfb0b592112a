"""The real workload for characterization on a Jetson: a Hugging Face fine-tuning loop, measured from the rails.

UNTESTED ON HARDWARE. There is no Jetson where this was written; the code follows the documented interfaces
(transformers, datasets, torch.cuda, the INA3221 hwmon files through governor.rails, the GPU load file through the
devfreq backend) but has never run on a board. Treat its first run there as a test.

Everything heavy (torch, transformers, datasets) is imported inside the functions that need it: importing this module
costs nothing, and the simulated path never touches it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from governor.errors import FtgovError
from governor.pipeline.measure import Measurement

# GLUE text columns per task (the GLUE dataset cards); the label column is "label" everywhere.
GLUE_TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "sst2": ("sentence",), "cola": ("sentence",), "qnli": ("question", "sentence"),
    "mrpc": ("sentence1", "sentence2"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
}
GLUE_NUM_LABELS = {"stsb": 1, "mnli": 3}


class RailSampler:
    """Samples rail power and GPU load on a thread while a measurement runs, integrating power over time.

    A sampler, not a wait: it must look at the rails at a fixed rate because the INA3221 only reports instantaneous
    power. Each interval between two samples is integrated at the mean of its end points (trapezoid rule).
    """

    def __init__(self, rails, gpu, interval_s: float = 0.05):
        self.rails = rails
        self.gpu = gpu
        self.interval_s = interval_s
        self.measurement = Measurement.start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> "RailSampler":
        self._thread = threading.Thread(target=self._run, name="rail-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._error is not None and exc[0] is None:
            raise FtgovError(f"rail sampling failed: {self._error}") from self._error

    def _sample(self) -> tuple[float, dict[str, float], float | None, float | None]:
        reading = self.gpu.read()
        return time.monotonic(), self.rails.read_mw(), reading.load_pct, reading.cur_hz

    def _run(self) -> None:
        try:
            prev = self._sample()
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
    """A GLUE task read from a local copy: a datasets.save_to_disk directory, or train.{tsv,csv,jsonl}."""

    name: str
    path: Path

    def load_train(self):
        import datasets

        if (self.path / "dataset_dict.json").exists() or (self.path / "dataset_info.json").exists():
            data = datasets.load_from_disk(str(self.path))
            return data["train"] if isinstance(data, datasets.DatasetDict) else data
        for ext, builder, kwargs in (("tsv", "csv", {"delimiter": "\t", "quoting": 3}), ("csv", "csv", {}),
                                     ("jsonl", "json", {})):
            f = self.path / f"train.{ext}"
            if f.exists():
                return datasets.load_dataset(builder, data_files=str(f), split="train", **kwargs)
        raise FtgovError(f"no GLUE data under {self.path}: expected a save_to_disk directory or train.tsv/csv/jsonl")


class HfTrainingRunner:
    """Fine-tunes a local BERT/Pythia checkpoint on a local GLUE task, one optimizer step per `run` step.

    fp16 autocast with a gradient scaler, AdamW, dynamic padding: the setup the energy model assumes.
    """

    def __init__(self, model_dir: Path, task: HfTask, gpu, rails, batch_size: int = 32, lr: float = 2e-5,
                 seed: int = 0, max_len: int = 128):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

        if not torch.cuda.is_available():
            raise FtgovError("CUDA is not available: the real characterization needs the Jetson's GPU")
        if task.name not in GLUE_TEXT_COLUMNS:
            raise FtgovError(f"unknown GLUE task {task.name!r}; known: {sorted(GLUE_TEXT_COLUMNS)}")
        torch.manual_seed(seed)
        self.gpu, self.rails, self.batch_size = gpu, rails, batch_size
        self.device = torch.device("cuda")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        if self.tokenizer.pad_token is None:  # Pythia ships without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, local_files_only=True, num_labels=GLUE_NUM_LABELS.get(task.name, 2)).to(self.device)
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        columns = GLUE_TEXT_COLUMNS[task.name]
        train = task.load_train()
        encoded = train.map(lambda b: self.tokenizer(*[b[c] for c in columns], truncation=True, max_length=max_len),
                            batched=True, remove_columns=[c for c in train.column_names if c != "label"])
        self.seq_len = float(sum(len(ids) for ids in encoded["input_ids"]) / len(encoded))
        self.loader = torch.utils.data.DataLoader(encoded.rename_column("label", "labels"), batch_size=batch_size,
                                                  shuffle=True, collate_fn=DataCollatorWithPadding(self.tokenizer))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.scaler = torch.amp.GradScaler("cuda")  # torch >= 2.3 (JetPack 6 wheels are 2.3+)
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
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(**batch).loss
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, steps: int, warmup: int = 0) -> Measurement:
        import torch

        self.model.train()
        for _ in range(warmup):
            self._step()
        torch.cuda.synchronize()
        with RailSampler(self.rails, self.gpu) as sampler:
            for _ in range(steps):
                self._step()
            torch.cuda.synchronize()
        sampler.measurement.steps = steps
        return sampler.measurement
