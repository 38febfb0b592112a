"""What the Hugging Face and Lightning callbacks share (governor.hf, governor.lightning)."""

from __future__ import annotations

from governor.client.job import Job, split_options, start_job
from governor.text import made_up_name


class AdapterCore:
    """What the Hugging Face and Lightning callbacks share: their options (exactly ``governor.job``'s keywords),
    starting the job once per training run, closing it (idempotent), and use as a context manager. Every option is
    optional; explicit numbers override the model's."""

    def __init__(self, **options):
        # governor.job's keywords, checked now (a misspelt one is a TypeError, a bad number a ValueError) and passed
        # on whole when the training run starts.
        split_options(options)
        self._options = options
        self.job: Job | None = None

    def _start(self, model, default_name: str | None, total_steps: int | None = None,
               known: dict | None = None) -> bool:
        """Start the job for this training run; False when one is already open (a retried or repeated train on the
        same model and data: the job and its pin carry on). ``total_steps``: the run's optimizer steps, when the
        framework knows them (a ``total_steps`` option wins); ``known``: other options the framework knows (a
        rank's place in its run), for those not given."""
        if self.job is not None and not self.job.closed:
            # The job now ends after the steps it counted and this run's (a retry with a smaller batch runs more).
            if self._options.get("total_steps") is None and total_steps is not None:
                self.job.set_total_steps(self.job.steps + total_steps)
            return False
        options = dict(self._options)
        options["name"] = options.get("name") or made_up_name(default_name)
        if options.get("total_steps") is None:
            options["total_steps"] = total_steps
        for key, value in (known or {}).items():
            if options.get(key) is None:
                options[key] = value
        self.job = start_job(model, **options)
        return True

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
