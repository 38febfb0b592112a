"""The Lightning adapter: a real Lightning Trainer fitting a tiny BERT-shaped model (random weights, synthetic
token ids, CPU torch) against the real ftgovd on a fake Orin tree."""

from __future__ import annotations

import re

import pytest

pl = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from governor.lightning import GovernorCallback  # noqa: E402
from tests.support.daemon import held_phase, limits  # noqa: E402

BASELINE = (306000000, 1300500000)
VOCAB = 50


def padded_batch(items):
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.zeros(len(items), width, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        mask[row, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([label for _, label in items])}


def loader(n: int = 64):
    g = torch.Generator().manual_seed(0)
    items = [(torch.randint(5, VOCAB, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist(), i % 2)
             for i in range(n)]
    return torch.utils.data.DataLoader(items, batch_size=4, collate_fn=padded_batch)


class TinyBert(pl.LightningModule):
    def __init__(self, fail_at_batch: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64, num_labels=2)
        self.model = transformers.BertForSequenceClassification(config)
        self.fail_at_batch = fail_at_batch

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("a training failure")
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Spy(pl.Callback):
    def __init__(self, root):
        self.root = root
        self.limits_seen = []
        self.batches = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        mask = batch["attention_mask"]
        self.batches.append((float(mask.sum()), mask.shape[0]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.limits_seen.append(limits(self.root))


def trainer(callbacks, steps: int = 8):
    return pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)


def test_lightning_fit_holds_the_pin_and_ends_the_job(start_daemon, orin):
    daemon = start_daemon()
    spy = Spy(orin)
    governor_cb = GovernorCallback(socket=daemon.socket, measure_batches=4)
    trainer([governor_cb, spy]).fit(TinyBert(), loader())
    job = governor_cb.job
    pin = job.registration["freq_hz"]
    assert spy.limits_seen[:3] == [BASELINE] * 3 and spy.limits_seen[3:] == [(pin, pin)] * 5
    assert limits(orin) == BASELINE
    tokens, samples = map(sum, zip(*spy.batches[:4], strict=False))
    assert job.features["seq_len"] == pytest.approx(tokens / samples)
    assert (job.features["num_layers"], job.features["hidden_size"]) == (2, 32)
    assert re.search(rf"job {job.job_id} 'TinyBert' .*ended \(unregistered\) after [\d.]+ s, 8 steps", daemon.log())
    assert job.result["steps"] == 8 and job.result["duration_s"] > 0, "the end summary, as docs/clients.md says"


def test_exception_ends_the_job(start_daemon, orin):
    daemon = start_daemon()
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0)
    with pytest.raises(RuntimeError, match="a training failure"):
        trainer([governor_cb]).fit(TinyBert(fail_at_batch=3), loader())
    assert governor_cb.job.registration is not None
    assert limits(orin) == BASELINE
    assert re.search(r"job \d+ .*ended \(unregistered\) after [\d.]+ s, 3 steps", daemon.log()), daemon.log()


class TotalSteps(pl.Callback):
    """What the daemon holds as the job's length, read from its status after every batch."""

    def __init__(self, daemon):
        self.rpc, self.seen = daemon.client(), []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.extend(j["total_steps"] for j in self.rpc.call("status")["jobs"])


def test_the_fit_length_goes_to_the_daemon_for_the_tuners_budget(start_daemon, orin):
    daemon = start_daemon()
    governor_cb, spy = GovernorCallback(socket=daemon.socket, seq_len=20.0), TotalSteps(daemon)
    trainer([governor_cb, spy], steps=6).fit(TinyBert(), loader())
    assert governor_cb.job.total_steps == 6 and spy.seen == [6] * 6


class Phases(pl.Callback):
    """The phase the daemon holds for the job as each batch ends and while a checkpoint is saved, as (hook, step,
    phase): read after a call on the job's own connection, whose answer comes after every report sent before it."""

    def __init__(self, daemon, governor_cb):
        self.rpc, self.governor_cb, self.seen = daemon.client(), governor_cb, []

    def _record(self, hook: str, trainer) -> None:
        self.seen.append((hook, trainer.global_step, held_phase(self.rpc, self.governor_cb.job)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._record("batch", trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._record("save", trainer)


def test_a_checkpoint_save_is_reported_and_training_again_at_the_next_batch(start_daemon, orin, tmp_path):
    """A checkpoint save was reported as training: the tuner's windows, the baseline's parts and the steps at its
    pick took its energy as that of the step after it, and the checkpoint phase's lowest clock (low_phases) never
    applied."""
    daemon = start_daemon()
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0)
    phases = Phases(daemon, governor_cb)
    saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[governor_cb, phases, saves]).fit(TinyBert(), loader())
    assert [s for s in phases.seen if s[0] == "save"] == [("save", 2, "checkpoint"), ("save", 4, "checkpoint")]
    assert [s for s in phases.seen if s[0] == "batch"] == [("batch", n, "train") for n in (1, 2, 3, 4)]
    assert governor_cb.job.result["steps"] == 4


def test_a_group_rank_takes_its_place_from_the_trainer(start_daemon, orin, monkeypatch):
    """Lightning's own DDP launchers (strategy="ddp" run as `python train.py`, ddp_spawn) set LOCAL_RANK, NODE_RANK
    and WORLD_SIZE, not RANK: a GovernorCallback(group=...) rank registered with no rank, and its group never formed.
    The Trainer knows the rank's place."""
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    daemon = start_daemon()
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0, group="lightning-run")
    trainer([governor_cb], steps=3).fit(TinyBert(), loader())
    info = governor_cb.job.group_info
    assert (info.key, info.rank, info.world_size) == ("lightning-run", 0, 1)
    assert governor_cb.job.result["steps"] == 3


class TwoOptimizers(TinyBert):
    """A GAN's setup: manual optimization, two optimizers, each stepping once a training batch."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for opt in self.optimizers():
            opt.zero_grad()
            self.manual_backward(self.model(**batch).loss)
            opt.step()

    def configure_optimizers(self):
        return (torch.optim.AdamW(self.model.bert.parameters(), lr=1e-3),
                torch.optim.AdamW(self.model.classifier.parameters(), lr=1e-3))


class Progress(TotalSteps):
    """(the job's steps, its length as the daemon holds it) after every batch: read after a call on the job's own
    connection, whose answer comes after every report it sent before it."""

    def __init__(self, daemon, governor_cb):
        super().__init__(daemon)
        self.governor_cb = governor_cb

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        job = self.governor_cb.job
        job.update()
        (held,) = (j for j in self.rpc.call("status")["jobs"] if j["job_id"] == job.job_id)
        self.seen.append((job.steps, held["total_steps"]))


def fit_length(daemon, module, **limits) -> tuple[list, int]:
    """Fit ``module`` over 16 batches under ``limits`` (the Trainer's max_steps, max_epochs...): what Progress saw,
    and the steps the job ended with."""
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0)
    progress = Progress(daemon, governor_cb)
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[governor_cb, progress], **limits).fit(module, loader())
    return progress.seen, governor_cb.job.result["steps"]


def test_manual_optimization_with_two_optimizers_counts_a_step_per_batch(start_daemon, orin):
    """Under manual optimization global_step counts each optimizer.step() call, two a batch here, while the fit's
    length (estimated_stepping_batches) counts batches: the job's progress ran twice as fast as its length (the
    tuner's budget and the baseline's parts took it for half over at a quarter). A step is a training batch."""
    seen, steps = fit_length(start_daemon(), TwoOptimizers(), max_epochs=1)
    assert seen == [(n, 16) for n in range(1, 17)] and steps == 16


def test_manual_optimization_under_max_steps_learns_the_fits_length_in_batches(start_daemon, orin):
    """max_steps counts optimizer.step() calls under manual optimization: 12 with two optimizers is 6 batches. The
    length starts as Lightning's estimate (one step a batch) and is the batches' once the first batch has stepped."""
    seen, steps = fit_length(start_daemon(), TwoOptimizers(), max_steps=12)
    assert seen == [(n, 6) for n in range(1, 7)] and steps == 6


def test_automatic_optimization_counts_optimizer_steps_under_gradient_accumulation(start_daemon, orin):
    seen, steps = fit_length(start_daemon(), TinyBert(), max_epochs=1, accumulate_grad_batches=2)
    assert seen == [(n // 2, 8) for n in range(1, 17)] and steps == 8
