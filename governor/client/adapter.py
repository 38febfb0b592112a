"""What the Hugging Face and Lightning callbacks share (governor.hf, governor.lightning)."""

from __future__ import annotations

from governor.client.group import ANNOUNCE_WAIT_S, NO_GROUP, group_from_env, shared_run_key
from governor.client.job import Job, split_options, start_job
from governor.client.warning import warn
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
        rank's place in its run, _place), for those not given (and NO_GROUP's, whatever is given)."""
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
            # Ranks that did not agree on a group (NO_GROUP) stand alone even with a group= given: a rank across
            # nodes would otherwise wait in its group's collectives for ranks that hold no callback.
            if options.get(key) is None or (key == "group" and value == NO_GROUP):
                options[key] = value
        self.job = start_job(model, **options)
        return True

    def _place(self, prefix: str, rank: int, world_size: int) -> dict:
        """The rank's place in its run (``known`` for _start), as its framework's Trainer knows it: rank and world
        size and, with several ranks, the run's group key: the caller's or the launcher's, else rank 0's, made for a
        launcher that sets none (deepspeed's, mpirun, Lightning's own DDP: ``prefix-<random>``), once every rank's
        callback agreed on it over the process group's store (shared_run_key); NO_GROUP, and a warning, where not
        every rank took part; with neither a key nor a process group, none, and a warning that names the group option.
        Call it at a hook that every rank passes once per train start (a framework's train-start hook), before
        anything only this process knows decides. One process never touches torch.distributed."""
        place: dict = {"rank": rank, "world_size": world_size}
        if world_size > 1:
            told = group_from_env(self._options.get("group"))
            place["group"] = shared_run_key(prefix, told.key if told is not None else None)
            if place["group"] == NO_GROUP:
                # A collective at train start hung the training for good where only rank 0 held a callback (the
                # others waited in DDP's all-reduce); a run whose ranks did not all agree on a group is none.
                warn(f"ftgov: this process is rank {rank} of {world_size} of a training run, but not every rank's "
                     f"GovernorCallback answered at train start (within {ANNOUNCE_WAIT_S:g} s of rank 0's): this "
                     "rank's job stands alone, and a run across nodes is not tuned. Give every rank's Trainer a "
                     "GovernorCallback, not only rank 0's (each takes part in its run's job group); where every rank "
                     "has one, a rank reached its train start late (a slow setup of its own)")
            elif place["group"] is None:
                # Ranks with no torch.distributed group to agree over (a Trainer under torch_xla, whose processes
                # accelerate counts without one) and no key: each registered a job of its own, silently, and under tune
                # their tuners fought. Once a place (Python's filter): a run's every train begin would say the same.
                warn(f"ftgov: this process is rank {rank} of {world_size} of a training run, but nothing tells its "
                     "ranks that they are one run (no group key from the launcher: TORCHELASTIC_RUN_ID, a Slurm "
                     "step; no torch.distributed process group to agree on one over): each rank's job stands alone, "
                     "and under tune their tuners fight. Pass the same key to every rank's callback: "
                     "GovernorCallback(group=...)")
        return place

    def close(self) -> None:
        """End the job (unregister). Safe to call more than once."""
        if self.job is not None:
            self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
