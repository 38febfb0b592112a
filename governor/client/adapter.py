"""What the Hugging Face and Lightning callbacks share (governor.hf, governor.lightning)."""

from __future__ import annotations

from governor.client.connection import DEFAULT_REPORT_EVERY_S
from governor.client.features import check_partial_features
from governor.client.job import Job, start_job


class AdapterCore:
    """What the Hugging Face and Lightning callbacks share: their options, starting the job once per training run,
    closing it (idempotent), and use as a context manager. Every argument is optional; explicit numbers override
    the model's."""

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

    def _start(self, model, default_name: str | None, total_steps: int | None = None) -> bool:
        """Start the job for this training run; False when one is already open (a retried or repeated train on the
        same model and data: the job and its pin carry on). ``total_steps``: the run's optimizer steps, when the
        framework knows them."""
        if self.job is not None and not self.job.closed:
            return False
        options = dict(self._options)
        options["name"] = options["name"] or default_name
        self.job = start_job(model, **options, total_steps=total_steps, **self._explicit)
        return True

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
