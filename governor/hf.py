"""Hugging Face Trainer adapter: ``Trainer(..., callbacks=[GovernorCallback()])``.

A thin layer over governor.client.Job: register at train begin (with the run's length, state.max_steps, for the
tuner's budget), progress at each optimizer step, unregister at train end. With no arguments the features come from
the trainer's model (its config) and the sequence length from the first training batches' attention masks, seen
through a forward pre-hook that removes itself once it has measured.

The Trainer has no callback for a failed run. A process that dies closes its connection, which ends the job in the
daemon; in a process that lives on after a caught exception (a notebook) the job ends when the next training run
begins in its thread (_end_abandoned), or with the callback's ``with`` block, or ``close()``::

    with GovernorCallback() as governor_cb:
        Trainer(model, args, train_dataset=ds, callbacks=[governor_cb]).train()
"""

from __future__ import annotations

import logging
import threading
import weakref

try:
    from transformers import TrainerCallback
except ImportError as e:  # governor itself never needs transformers; only this adapter does
    raise ImportError("governor.hf needs transformers: pip install 'ftgov[hf]'") from e

from governor.client import AdapterCore, find_hf_config
from governor.client.warning import warn

log = logging.getLogger("governor.client")

# The callback whose job trains each model now: a second GovernorCallback on one Trainer (two instances; the Trainer
# only logs that it holds one of the class) made a second job on the same GPU, which pinned the higher of their levels
# and counted the same energy twice. The first to start holds the run; the other does nothing.
_TRAINING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The callbacks of this process whose job is open (_end_abandoned).
_OPEN: weakref.WeakSet = weakref.WeakSet()


class GovernorCallback(AdapterCore, TrainerCallback):
    """Hold an ftgov job while the Trainer trains (options: governor.client.AdapterCore)."""

    def __init__(self, **options):
        super().__init__(**options)
        self._hook = None
        # Under nn.DataParallel (a Trainer on several GPUs without torchrun) each replica's forward runs in a thread
        # of its own, the hook with it: the job's measurement, and the register it ends in, are not for two at once.
        self._observing = threading.Lock()
        # The global_step of the last step counted: a Trainer that holds this callback twice (callbacks=[cb] and
        # add_callback(cb), which it only logs) calls it twice at every event, and each step counts once.
        self._counted_step: int | None = None
        self._stood_down = False  # another GovernorCallback on this Trainer holds the run: said once
        # The training run that began last: (thread, its TrainerState, a weak reference to its model).
        self._run: tuple | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._counted_step = state.global_step  # a retried run starts over from its checkpoint's step, or 0
        # The rank's place in its run, from the Trainer (TrainingArguments brought the process group up when it set
        # its device, before train()): deepspeed's launcher and mpirun set no group key, so the ranks' jobs were
        # separate and their tuners fought. First, before what only this process knows (a second callback): with
        # several ranks every rank's callback agrees on the group here (a rank missing: none, after a bounded wait).
        place = self._place("hf", args.process_index, args.world_size)
        run = (threading.get_ident(), state, _weak(model))
        _end_abandoned(self, run)
        if self.job is not None and not self.job.closed and self._run is not None and self._run[2]() is not model:
            self.close()  # train() again after a failed one, on another model: a run of its own, not a retry
        self._run = run
        # A second train begin without an end is the Trainer retrying (auto_find_batch_size) or a new train() after
        # a failed one on the same model: the same run, so the job and its pin carry on.
        holder = _holder(model)
        if holder is not None and holder is not self:
            if not self._stood_down:
                self._stood_down = True
                warn(f"ftgov: this Trainer holds two GovernorCallbacks; this one does nothing while job "
                     f"{holder.job.job_id if holder.job is not None else '-'} of the other governs the run (one job "
                     "per run: two would pin the higher of their levels and count the same energy twice)")
            return
        if not self._start(model, _run_name(args, model), _steps_left(state), place):
            return
        _OPEN.add(self)
        if model is not None:
            try:
                _TRAINING[model] = self
            except TypeError:  # a model that takes no weak reference: nothing to tell the other callbacks
                pass
        if not self.job.seq_len_known and not self.job.disabled and model is not None:
            self._hook = model.register_forward_pre_hook(self._observe, with_kwargs=True)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.job is not None:
            self.job.phase("train")

    def on_step_end(self, args, state, control, **kwargs):
        if self.job is not None:
            if state.global_step != self._counted_step:
                self._counted_step = state.global_step
                self.job.step()
            self._leaving_training(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._leaving_training(control)

    def on_evaluate(self, args, state, control, **kwargs):
        # save_strategy="best" sets should_save after on_evaluate, from the metrics: until the next step the Trainer
        # only compares them with the best yet and saves when they are better.
        if self.job is not None and (control.should_save or getattr(args, "save_strategy", None) == "best"):
            self.job.phase("checkpoint")

    def _leaving_training(self, control) -> None:
        """The Trainer evaluates, then saves, after the step (or epoch) whose end set its control flags: reported
        before they begin, so that the tuner's windows and the steps at its pick leave their energy out and a
        checkpoint gets the lowest clock (low_phases). Training is reported again at the next step's begin."""
        if self.job is None:
            return
        if control.should_evaluate:
            self.job.phase("eval")
        elif control.should_save:
            self.job.phase("checkpoint")

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.job is not None:
            self.job.phase("eval")

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """End the job (unregister) and drop the hook. Safe to call more than once."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        _OPEN.discard(self)
        super().close()

    def __getstate__(self):
        # hyperparameter_search(backend="ray") pickles the Trainer, its callbacks with it, for Ray's workers: the copy
        # is this callback as made (each trial's train() starts a job of its own there); a lock, a hook on a model and
        # a job's connection do not travel.
        state = dict(self.__dict__, job=None, _hook=None, _counted_step=None, _stood_down=False, _run=None)
        del state["_observing"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._observing = threading.Lock()

    def _observe(self, module, args, kwargs):
        if not module.training or self.job is None:
            return None
        with self._observing:
            if self._hook is None:  # another replica's thread finished the measurement meanwhile
                return None
            self.job.observe_batch(kwargs)
            if self.job.seq_len_known or self.job.disabled:
                self._hook.remove()
                self._hook = None
        return None


def _end_abandoned(starting: GovernorCallback, run: tuple) -> None:
    """End the jobs of runs that raised out of train(): the Trainer tells its callbacks nothing then, so such a job
    stayed open while the process lived on (a notebook: an interrupted cell, an out-of-memory error). Re-running the
    cell made a new callback, which either stood down for the old one on the same model (whose job then counted none
    of the new run's steps and never ended) or started a second job beside it on a new model. A run that begins in
    the thread of another's run is after it: that run is over."""
    thread, state = run[0], run[1]
    for other in list(_OPEN):
        if other is starting or other.job is None or other.job.closed or other._run is None:
            continue
        if other._run[0] == thread and other._run[1] is not state:
            log.info("ftgov: job %s: its train() ended without on_train_end (it raised); a new run begins, so "
                     "it ends here", other.job.job_id)
            other.close()


def _weak(model):
    """A weak reference to ``model``, or a callable that gives None for one that takes none (nothing to compare)."""
    try:
        return weakref.ref(model)
    except TypeError:
        return lambda: None


def _steps_left(state) -> int | None:
    """The optimizer steps this train() will run (the tuner's budget is priced over them): max_steps, which the
    Trainer sets from num_train_epochs when max_steps is not given, less the steps of a resumed checkpoint."""
    total, done = getattr(state, "max_steps", 0), getattr(state, "global_step", 0) or 0
    if isinstance(total, int) and not isinstance(total, bool) and total > done:
        return total - done
    return None


def _run_name(args, model) -> str | None:
    config = find_hf_config(model)
    return (getattr(config, "name_or_path", None) or getattr(args, "run_name", None)
            or getattr(config, "model_type", None))


def _holder(model) -> GovernorCallback | None:
    """The callback whose open job trains ``model`` now, if any."""
    try:
        holder = _TRAINING.get(model) if model is not None else None
    except TypeError:
        return None
    return holder if holder is not None and holder.job is not None and not holder.job.closed else None
