"""PyTorch Lightning adapter: ``Trainer(callbacks=[GovernorCallback()])``.

A thin layer over governor.client.Job: register when training starts, progress per optimizer step (the trainer's
global_step, as the Hugging Face adapter counts), unregister when training ends or fails (on_exception). With no
arguments the features come from the LightningModule (a Hugging Face model it holds, found through its config) and
the sequence length from the first training batches' attention masks.

Uses ``lightning.pytorch`` when installed, else the older ``pytorch_lightning`` package: the Trainer only accepts
callbacks derived from its own package's Callback.
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:  # governor itself never needs Lightning; only this adapter does
        raise ImportError("governor.lightning needs Lightning: pip install 'ftgov[lightning]'") from e

import math

from governor.client import AdapterCore, find_hf_config


class GovernorCallback(AdapterCore, Callback):
    """Hold an ftgov job while the Lightning Trainer fits (options: governor.client.AdapterCore)."""

    def __init__(self, **options):
        super().__init__(**options)
        self._first_global_step = 0

    def on_train_start(self, trainer, pl_module):
        config = find_hf_config(pl_module)
        # The rank's place in its run, from the Trainer: Lightning's own DDP launchers (ddp from `python train.py`,
        # ddp_spawn) set no RANK in the environment, and no group key, so the ranks' jobs were separate (their tuners
        # fought) and a group= rank had no rank.
        place = self._place("lightning", trainer.global_rank, trainer.world_size)  # every rank runs this hook here
        if self._start(pl_module, getattr(config, "name_or_path", None) or type(pl_module).__name__,
                       _steps_left(trainer), place):
            self._first_global_step = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.job is not None:
            self.job.phase("train")  # after a checkpoint save (on_save_checkpoint)
            self.job.observe_batch(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.job is None:
            return
        done = trainer.global_step - self._first_global_step
        if done > self.job.steps:  # several batches per step under gradient accumulation
            self.job.step(done - self.job.steps)

    def on_validation_start(self, trainer, pl_module):
        if self.job is not None:
            self.job.phase("eval")

    def on_validation_end(self, trainer, pl_module):
        if self.job is not None:
            self.job.phase("train")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # Called as the checkpoint is assembled, before it is written: the write is no training step's (the tuner's
        # windows leave its energy out) and needs only the lowest clock (low_phases).
        if self.job is not None:
            self.job.phase("checkpoint")

    def on_train_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        self.close()

    def teardown(self, trainer, pl_module, stage):
        self.close()


def _steps_left(trainer) -> int | None:
    """The optimizer steps this fit will run, for the tuner's budget: estimated_stepping_batches (max_steps, or the
    epochs' batches over gradient accumulation; inf for an endless fit), else max_steps when set; less global_step."""
    try:
        estimated = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - it may need a datamodule the trainer cannot size; the length is optional
        estimated = None
    done = getattr(trainer, "global_step", 0) or 0
    for total in (estimated, getattr(trainer, "max_steps", -1)):
        if isinstance(total, (int, float)) and not isinstance(total, bool) and math.isfinite(total) and total > done:
            return int(total) - done
    return None

