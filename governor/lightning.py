"""PyTorch Lightning adapter: ``Trainer(callbacks=[GovernorCallback()])``.

A thin layer over governor.client.Job: register when training starts, progress per optimizer step (the trainer's
global_step, as the Hugging Face adapter counts) or, under manual optimization, per training batch; unregister when
training ends or fails (on_exception). With no arguments the features come from the LightningModule (a Hugging Face
model it holds, found through its config) and the sequence length from the first training batches' attention masks.

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
        # Under manual optimization (automatic_optimization = False) global_step counts every optimizer.step() call,
        # two a batch for a GAN's two optimizers, while estimated_stepping_batches counts batches: the job's progress
        # ran ahead of its length (its tuner's budget and baseline parts took it for half over at a quarter). A step
        # is then a training batch; where max_steps (in optimizer steps) ends the fit, _ManualLength tells its length.
        self._manual: _ManualLength | None = None

    def on_train_start(self, trainer, pl_module):
        config = find_hf_config(pl_module)
        # The rank's place in its run, from the Trainer: Lightning's own DDP launchers (ddp from `python train.py`,
        # ddp_spawn) set no RANK in the environment, and no group key, so the ranks' jobs were separate (their tuners
        # fought) and a group= rank had no rank.
        place = self._place("lightning", trainer.global_rank, trainer.world_size)  # every rank's callback agrees
        manual = not getattr(pl_module, "automatic_optimization", True)
        self._manual = _ManualLength(trainer) if manual else None
        total = self._manual.batches_left(trainer, 0) if self._manual is not None else _steps_left(trainer)
        if self._start(pl_module, getattr(config, "name_or_path", None) or type(pl_module).__name__, total, place):
            self._first_global_step = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.job is not None:
            self.job.phase("train")  # after a checkpoint save (on_save_checkpoint)
            self.job.observe_batch(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.job is None:
            return
        if self._manual is not None:
            self.job.step()
            total = self._manual.relength(trainer, self.job.steps)
            if total is not None and self._options.get("total_steps") is None:
                self.job.set_total_steps(total)
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


class _ManualLength:
    """The length of a fit under manual optimization, in training batches. Its epochs' batches are known at its
    start; max_steps counts optimizer.step() calls in this mode, so the batches until it depend on how many a batch
    makes (two for a GAN, a fraction under accumulation by hand): one until a batch has stepped (as
    estimated_stepping_batches assumes), then the pace so far, taken again after 1, 2, 4, 8... batches (a pattern
    such as five discriminator steps to a generator's shows only over several batches)."""

    def __init__(self, trainer):
        self.batches_before = max(0, getattr(trainer.fit_loop, "total_batch_idx", -1) + 1)  # a resumed fit's
        self.steps_before = getattr(trainer, "global_step", 0) or 0
        self._next = 1  # the batch count of the next relength

    def batches_left(self, trainer, batches: int) -> int | None:
        """The batches this fit runs after its first ``batches``: the fewer of its epochs' and, where max_steps is
        set, those it takes at the pace so far to reach it; None when neither is known, or none are left."""
        left = []
        per_epoch, epochs = trainer.num_training_batches, trainer.max_epochs
        if isinstance(per_epoch, int) and isinstance(epochs, int) and epochs >= 0:  # per_epoch inf: iterable data
            left.append(per_epoch * max(epochs, 1) - self.batches_before - batches)
        max_steps = getattr(trainer, "max_steps", -1)
        if isinstance(max_steps, int) and max_steps >= 0:
            stepped = trainer.global_step - self.steps_before
            pace = stepped / batches if batches > 0 and stepped > 0 else 1.0
            left.append(math.ceil((max_steps - trainer.global_step) / pace))
        return min(left) if left and min(left) > 0 else None

    def relength(self, trainer, batches: int) -> int | None:
        """The fit's length in batches (``batches`` done and those left) at the batch counts where it is taken again
        (max_steps set), else None."""
        if batches < self._next or getattr(trainer, "max_steps", -1) < 0:
            return None
        self._next = 2 * batches
        left = self.batches_left(trainer, batches)
        return None if left is None else batches + left
