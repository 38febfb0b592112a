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

from governor.client import DEFAULT_REPORT_EVERY_S, Job, check_partial_features, find_hf_config, start_job


class GovernorCallback(Callback):
    """Hold an ftgov job while the Lightning Trainer fits. Every argument is optional; explicit numbers win."""

    def __init__(self, *, model_type: str | None = None, num_layers: int | None = None,
                 hidden_size: int | None = None, seq_len: float | None = None, gpu_util: float | None = None,
                 name: str | None = None, socket: str | None = None, report_every_s: float = DEFAULT_REPORT_EVERY_S,
                 measure_batches: int = 8):
        self._explicit = dict(model_type=model_type, num_layers=num_layers, hidden_size=hidden_size,
                              seq_len=seq_len, gpu_util=gpu_util)
        check_partial_features(self._explicit)
        self._options = dict(name=name, socket=socket, report_every_s=report_every_s,
                             measure_batches=measure_batches)
        self.job: Job | None = None
        self._first_global_step = 0

    def on_train_start(self, trainer, pl_module):
        if self.job is not None and not self.job.closed:
            return
        options = dict(self._options)
        config = find_hf_config(pl_module)
        options["name"] = options["name"] or getattr(config, "name_or_path", None) or type(pl_module).__name__
        self._first_global_step = trainer.global_step
        self.job = start_job(pl_module, **options, **self._explicit)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.job is not None:
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

    def on_train_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        self.close()

    def teardown(self, trainer, pl_module, stage):
        self.close()

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()
