"""What the Hugging Face and Lightning callbacks share (governor.hf, governor.lightning)."""

from __future__ import annotations

from governor.client.group import group_from_env, shared_run_key
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

    def _place(self, prefix: str, rank: int, world_size: int) -> dict:
        """The rank's place in its run (``known`` for _start), as its framework's Trainer knows it: rank and world
        size and, with several ranks, the run's group key: the caller's or the launcher's, else rank 0's, made for a
        launcher that sets none (deepspeed's, mpirun, Lightning's own DDP: ``prefix-<random>``). With several ranks it
        is a broadcast whatever this rank knows (shared_run_key): call it where every rank passes at the same point
        (a framework's train-start hook), before anything only this process knows decides. One process never touches
        torch.distributed."""
        place: dict = {"rank": rank, "world_size": world_size}
        if world_size > 1:
            told = group_from_env(self._options.get("group"))
            place["group"] = shared_run_key(prefix, told.key if told is not None else None)
        return place

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
