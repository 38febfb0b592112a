"""The Hugging Face adapter: a real Trainer fine-tuning a tiny BERT-shaped model (random weights, synthetic text, a
WordPiece vocabulary built here, CPU torch) against the real ftgovd on a fake Orin tree."""

from __future__ import annotations

import random
import re
import warnings

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from governor.client import GovernorWarning, find_hf_config  # noqa: E402
from governor.features import from_hf_config  # noqa: E402
from governor.hf import GovernorCallback  # noqa: E402
from tests.support.daemon import held_phase, limits  # noqa: E402

WORDS = ["the", "film", "was", "good", "bad", "great", "plot", "acting", "very", "not", "slow", "fun", "a", "story"]
BASELINE = (306000000, 1300500000)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizer(vocab_file=str(vocab))


class Sentences(torch.utils.data.Dataset):
    """Synthetic sentences of 3..30 words: padded batches are much longer than their average sample."""

    def __init__(self, tokenizer, n: int, seed: int = 0):
        rng = random.Random(seed)
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(n)]
        self.items = [{**tokenizer(t), "labels": rng.randint(0, 1)} for t in texts]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def tiny_bert(vocab_size: int) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    return BertForSequenceClassification(config)


class Spy(TrainerCallback):
    """Reads the devfreq limits at every step, and the non-padding length of the batches the model is fed."""

    def __init__(self, root, model, fail_at_step: int | None = None):
        self.root, self.fail_at_step = root, fail_at_step
        self.limits_seen: list[tuple[int, int]] = []
        self.lengths: list[tuple[float, int]] = []
        model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        if module.training:
            mask = kwargs["attention_mask"]
            self.lengths.append((float(mask.sum()), mask.shape[0], mask.shape[1]))

    def on_step_end(self, args, state, control, **kwargs):
        self.limits_seen.append(limits(self.root))
        if state.global_step == self.fail_at_step:
            raise RuntimeError("a training failure")


def trainer_for(model, tokenizer, tmp_path, callbacks, steps: int = 12) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
                             learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=Sentences(tokenizer, 64),
                   data_collator=DataCollatorWithPadding(tokenizer), callbacks=callbacks)


@pytest.fixture
def simulated(start_daemon):
    """ftgovd --simulate: a simulated Orin whose load and rails follow the pin; returns the daemon and its tree."""
    daemon = start_daemon(simulate=True)
    return daemon, daemon.state_dir / "sim-orin"


def test_trainer_run_holds_the_pin_and_ends_the_job(simulated, tokenizer, tmp_path):
    daemon, orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    spy = Spy(orin, model)
    governor_cb = GovernorCallback(socket=daemon.socket, measure_batches=4)  # no features: all from model and data
    trainer_for(model, tokenizer, tmp_path, [governor_cb, spy]).train()

    job = governor_cb.job
    assert job.registration is not None, daemon.log()
    pin = job.registration["freq_hz"]
    # The first steps ran before seq_len was measured (registration waits for 4 batches); after that, the pin held.
    assert spy.limits_seen[:3] == [BASELINE] * 3
    assert spy.limits_seen[4:] == [(pin, pin)] * (len(spy.limits_seen) - 4)
    assert limits(orin) == BASELINE, "the baseline is back once training ended"

    tokens, samples = sum(t for t, _, _ in spy.lengths[:4]), sum(n for _, n, _ in spy.lengths[:4])
    padded = sum(n * width for _, n, width in spy.lengths[:4]) / samples
    assert job.features["seq_len"] == pytest.approx(tokens / samples)
    assert job.features["seq_len"] < padded, "the measure is of real tokens, not the padded length"
    assert (job.features["model_type"], job.features["num_layers"], job.features["hidden_size"]) == ("encoder", 2, 32)

    log = daemon.log()
    assert re.search(rf"job {job.job_id} .*encoder L2 H32 seq {job.features['seq_len']:g} ", log), log
    assert re.search(rf"job {job.job_id} .*ended \(unregistered\) after [\d.]+ s, 12 steps", log), log
    assert job.result["energy_j"] > 0, "the simulated rails were integrated over the job"
    assert job.result["steps"] == 12


def test_failed_training_in_a_with_block_ends_the_job(simulated, tokenizer, tmp_path):
    daemon, orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    spy = Spy(orin, model, fail_at_step=3)
    with pytest.raises(RuntimeError, match="a training failure"):
        with GovernorCallback(socket=daemon.socket, seq_len=20.0, name="failing") as governor_cb:
            trainer_for(model, tokenizer, tmp_path, [governor_cb, spy]).train()
    pin = governor_cb.job.registration["freq_hz"]
    assert spy.limits_seen == [(pin, pin)] * 3
    assert limits(orin) == BASELINE
    assert re.search(r"job \d+ 'failing' .*ended \(unregistered\) after [\d.]+ s, 3 steps", daemon.log()), \
        "the governor (first in the list) counted step 3 before the spy raised"


def test_training_goes_on_without_the_daemon(tokenizer, tmp_path):
    model = tiny_bert(tokenizer.vocab_size)
    governor_cb = GovernorCallback(socket=str(tmp_path / "absent.sock"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output = trainer_for(model, tokenizer, tmp_path, [governor_cb], steps=4).train()
    assert output.global_step == 4
    ours = [w for w in caught if w.category is GovernorWarning]
    assert len(ours) == 1 and "ftgovd is not running" in str(ours[0].message)


def test_bad_explicit_numbers_fail_when_the_callback_is_made():
    with pytest.raises(ValueError, match="num_layers"):
        GovernorCallback(num_layers=0)
    with pytest.raises(ValueError, match="name: must not contain control"):
        GovernorCallback(name="bert\nsst2")  # the daemon would refuse the job when training began


@pytest.mark.parametrize("config_cls, kwargs, expected", [
    ("BertConfig", dict(num_hidden_layers=12, hidden_size=768), ("encoder", 12, 768)),
    ("RobertaConfig", dict(num_hidden_layers=6, hidden_size=384), ("encoder", 6, 384)),
    ("DebertaV2Config", dict(num_hidden_layers=24, hidden_size=1024), ("encoder", 24, 1024)),
    ("GPTNeoXConfig", dict(num_hidden_layers=6, hidden_size=512), ("decoder", 6, 512)),
    ("GPT2Config", dict(n_layer=12, n_embd=768), ("decoder", 12, 768)),
    ("LlamaConfig", dict(num_hidden_layers=16, hidden_size=2048), ("decoder", 16, 2048)),
])
def test_features_from_real_hf_configs(config_cls, kwargs, expected):
    config = getattr(transformers, config_cls)(**kwargs)
    f = from_hf_config(find_hf_config(config))
    assert (f["model_type"], f["num_layers"], f["hidden_size"]) == expected


@pytest.mark.parametrize("config_cls", ["T5Config", "BartConfig", "WhisperConfig"])
def test_a_real_encoder_decoder_config_asks_for_its_numbers(config_cls):
    with pytest.raises(ValueError, match="is an encoder-decoder model"):
        from_hf_config(getattr(transformers, config_cls)())
    shape = from_hf_config(getattr(transformers, config_cls)(), {"model_type": "decoder", "num_layers": 12})
    assert (shape["model_type"], shape["num_layers"]) == ("decoder", 12)


def test_config_found_through_a_wrapping_module():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = tiny_bert(20)

    assert find_hf_config(Wrapper()).num_hidden_layers == 2
    assert find_hf_config(torch.nn.Linear(2, 2)) is None


class TotalSteps(TrainerCallback):
    """What the daemon holds as the job's length, read from its status after every step."""

    def __init__(self, daemon):
        self.rpc, self.seen = daemon.client(), []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.extend(j["total_steps"] for j in self.rpc.call("status")["jobs"])


def test_the_trainers_max_steps_goes_to_the_daemon_for_the_tuners_budget(simulated, tokenizer, tmp_path):
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    governor_cb, spy = GovernorCallback(socket=daemon.socket, seq_len=20.0), TotalSteps(daemon)
    trainer_for(model, tokenizer, tmp_path, [governor_cb, spy], steps=5).train()
    assert governor_cb.job.total_steps == 5 and spy.seen == [5] * 5


def test_a_long_model_path_is_shortened_into_the_jobs_name(simulated, tokenizer, tmp_path):
    """The job is named after the model's path, which can be longer than the protocol's names: the daemon refused it,
    and the run went on without the governor. The name keeps the path's end instead."""
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    model.config.name_or_path = "/data/" + "checkpoints/" * 40 + "bert-run-7"
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GovernorWarning)
        trainer_for(model, tokenizer, tmp_path, [governor_cb], steps=2).train()
    name = governor_cb.job.name
    assert len(name) == 256 and name.startswith("\u2026") and name.endswith("/checkpoints/bert-run-7")
    assert governor_cb.job.result is not None


class Phases(TrainerCallback):
    """The phase the daemon holds for the job at the end of each step, after an evaluation and after a save, as
    (hook, step, phase): read after a call on the job's own connection, whose answer comes after every report the job
    sent before it."""

    def __init__(self, daemon, governor_cb):
        self.rpc, self.governor_cb, self.seen = daemon.client(), governor_cb, []

    def _record(self, hook: str, state) -> None:
        self.seen.append((hook, state.global_step, held_phase(self.rpc, self.governor_cb.job)))

    def on_step_end(self, args, state, control, **kwargs):
        self._record("step", state)

    def on_evaluate(self, args, state, control, **kwargs):
        self._record("evaluate", state)

    def on_save(self, args, state, control, **kwargs):
        self._record("save", state)


def phases_of_a_run(daemon, tokenizer, tmp_path, **saving) -> tuple[GovernorCallback, Phases]:
    """A 4-step Trainer run with evaluations and saves as ``saving`` (TrainingArguments) says, and the phases the
    daemon held for it (Phases)."""
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0)
    phases = Phases(daemon, governor_cb)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, learning_rate=1e-3, use_cpu=True, report_to=[],
                             logging_strategy="no", disable_tqdm=True, seed=0, **saving)
    Trainer(model=tiny_bert(tokenizer.vocab_size), args=args, train_dataset=Sentences(tokenizer, 64),
            eval_dataset=Sentences(tokenizer, 8, 1), data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[governor_cb, phases]).train()
    return governor_cb, phases


@pytest.mark.parametrize("evaluate", [False, True])
def test_the_trainers_evaluations_and_checkpoint_saves_are_reported_before_they_begin(simulated, tokenizer, tmp_path,
                                                                                      evaluate):
    """A checkpoint save (seconds to minutes of a large model's state written out) was reported as training: the
    tuner's windows, the baseline's parts and the steps at the pick took its energy as that of the step after it (a
    60 s save at 80 W inside a 20-step baseline part of 50 ms steps at 300 W read it 17 times dearer), and the
    checkpoint phase's lowest clock (low_phases) never applied. An evaluation was reported only from its first
    prediction step. Both are known when the step that precedes them ends (the Trainer's control flags)."""
    governor_cb, phases = phases_of_a_run(simulated[0], tokenizer, tmp_path, save_strategy="steps", save_steps=2,
                                          eval_strategy="steps" if evaluate else "no", eval_steps=2)
    around = [("evaluate", "checkpoint")] if evaluate else []
    expected = [("step", 1, "train")]
    for step in (2, 4):
        expected += [("step", step, "eval" if evaluate else "checkpoint"),
                     *[(hook, step, phase) for hook, phase in around], ("save", step, "checkpoint")]
        if step == 2:
            expected.append(("step", 3, "train"))
    assert phases.seen == expected
    assert governor_cb.job.result["steps"] == 4


def test_the_batches_are_measured_one_replica_at_a_time():
    """A Trainer on several GPUs without torchrun wraps the model in nn.DataParallel, whose replicas run their
    forward (and the forward pre-hook that measures the batches) each in a thread of its own. Job.observe_batch and
    the register it ends in are not for two threads at once (two registers on one connection): the hook measures
    under the callback's lock, and a replica that comes after the measurement ended measures nothing."""
    import threading
    from types import SimpleNamespace

    cb = GovernorCallback(socket="/nonexistent/ftgov.sock")
    seen: list[bool] = []

    class Job:
        seq_len_known = disabled = False

        def observe_batch(self, batch):
            lock = getattr(cb, "_observing", None)
            seen.append(lock is not None and lock.locked())  # under the callback's lock
            self.seq_len_known = True

    class Hook:
        def remove(self):
            pass

    cb.job, cb._hook = Job(), Hook()
    module = SimpleNamespace(training=True)
    threads = [threading.Thread(target=cb._observe, args=(module, (), {"input_ids": None})) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True] and cb._hook is None


def test_a_callback_the_trainer_holds_twice_counts_each_optimizer_step_once(simulated, tokenizer, tmp_path):
    """The Trainer calls a callback it was given twice (``callbacks=[cb]`` and ``add_callback(cb)``; it only logs that
    it holds one already) twice at every event: each optimizer step was counted twice, so the daemon's windows, the
    tuner's budget (steps against total_steps) and the job's summary read twice the steps the run made."""
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    governor_cb = GovernorCallback(socket=daemon.socket, seq_len=20.0, name="twice")
    trainer = trainer_for(model, tokenizer, tmp_path, [governor_cb], steps=5)
    trainer.add_callback(governor_cb)
    trainer.train()
    assert governor_cb.job.result["steps"] == 5
    assert re.search(r"job \d+ 'twice' .*ended \(unregistered\) after [\d.]+ s, 5 steps", daemon.log()), daemon.log()


class OutOfMemoryOnce(TrainerCallback):
    """A CUDA out-of-memory error at the begin of the step after ``at_step``, once: what auto_find_batch_size retries
    on, with a smaller batch."""

    def __init__(self, at_step: int):
        self.at_step, self.raised = at_step, False

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.raised and state.global_step == self.at_step:
            self.raised = True
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_run_retried_with_a_smaller_batch_sends_the_jobs_new_length(simulated, tokenizer, tmp_path):
    """auto_find_batch_size runs the training loop again, with a smaller batch, after an out-of-memory error: the job
    carries on (same model, same data), but its length was still the first try's max_steps (8 steps of 4 samples),
    where the retry runs more steps of fewer samples: the tuner priced its budget, and spread its baseline's parts,
    over a shorter job than the one it tuned."""
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    governor_cb, spy = GovernorCallback(socket=daemon.socket, seq_len=20.0), TotalSteps(daemon)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=1, per_device_train_batch_size=4,
                             auto_find_batch_size=True, learning_rate=1e-3, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Sentences(tokenizer, 32),
                      data_collator=DataCollatorWithPadding(tokenizer),
                      callbacks=[governor_cb, spy, OutOfMemoryOnce(at_step=2)])
    output = trainer.train()
    assert spy.seen[:2] == [8, 8], "the first try: 32 samples in batches of 4"
    steps = 2 + output.global_step  # the first try's two steps, then the retry's
    assert output.global_step > 8 and governor_cb.job.result["steps"] == steps
    assert spy.seen[2:] == [steps] * output.global_step


def test_a_save_of_the_best_model_is_reported_as_a_checkpoint(simulated, tokenizer, tmp_path):
    """save_strategy="best" decides to save after the evaluation, from its metrics, once on_evaluate has run: no
    control flag says so before, and the save ran as "eval" (at the job's pick, not low_phases' lowest clock)."""
    _governor_cb, phases = phases_of_a_run(simulated[0], tokenizer, tmp_path, eval_strategy="steps", eval_steps=2,
                                           save_strategy="best", metric_for_best_model="loss")
    assert phases.seen[:5] == [("step", 1, "train"), ("step", 2, "eval"), ("evaluate", 2, "checkpoint"),
                               ("save", 2, "checkpoint"), ("step", 3, "train")], \
        "the first evaluation's metric is the best yet: a save"


def test_the_trainer_pickles_with_the_callback_as_ray_tune_ships_it(simulated, tokenizer, tmp_path):
    """hyperparameter_search(backend="ray") pickles the Trainer, callbacks included, to run its trials in Ray's
    workers (after setting its model to None): the callback's lock did not pickle, and the search stopped with
    "cannot pickle '_thread.lock' object" before any trial trained. The copy trains under a job of its own."""
    import functools
    import pickle

    from accelerate.state import GradientState

    # accelerate's state, shared by every Trainer of the process, keeps a weak reference to the dataloader of a
    # training run before (another test's) that does not pickle: a trainer of a process that trained before the
    # search does not ship either, callback or not.
    GradientState._reset_state()
    daemon, _orin = simulated
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, skip_memory_metrics=True, seed=0)
    trainer = Trainer(model_init=functools.partial(tiny_bert, tokenizer.vocab_size), args=args,
                      train_dataset=Sentences(tokenizer, 16), data_collator=DataCollatorWithPadding(tokenizer),
                      callbacks=[GovernorCallback(socket=daemon.socket, seq_len=20.0, name="trial")])
    trainer.model = None
    shipped = pickle.loads(pickle.dumps(trainer))
    shipped.train()
    governor_cb = next(cb for cb in shipped.callback_handler.callbacks if isinstance(cb, GovernorCallback))
    assert governor_cb.job.result["steps"] == 3
    assert re.search(r"job \d+ 'trial' .*ended \(unregistered\) after [\d.]+ s, 3 steps", daemon.log()), daemon.log()


def test_a_second_governor_callback_on_one_trainer_does_nothing_and_says_so(simulated, tokenizer, tmp_path):
    """Two GovernorCallback instances on one Trainer (the Trainer only logs that it holds one of the class) made two
    jobs on one GPU: the higher of their pins, and the same energy counted twice. The first to start holds the run."""
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    first = GovernorCallback(socket=daemon.socket, seq_len=20.0, name="first")
    second = GovernorCallback(socket=daemon.socket, seq_len=20.0, name="second")
    with pytest.warns(GovernorWarning, match="holds two GovernorCallbacks; this one does nothing"):
        trainer_for(model, tokenizer, tmp_path, [first, second], steps=4).train()
    assert first.job.result["steps"] == 4 and second.job is None
    assert re.findall(r"job \d+ '(\w+)' .*ended \(", daemon.log()) == ["first"], daemon.log()


class InterruptAt(TrainerCallback):
    """A KeyboardInterrupt (a notebook's stop button) at the end of step ``at_step``, once."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            raise KeyboardInterrupt


class JobNames(TrainerCallback):
    """The names of the jobs the daemon holds, read after every step."""

    def __init__(self, daemon):
        self.rpc, self.seen = daemon.client(), []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(sorted(j["name"] for j in self.rpc.call("status")["jobs"]))


@pytest.mark.parametrize("again", ["new callback, same model", "new callback, new model", "same callback, new model"])
def test_a_run_that_raised_out_of_train_ends_its_job_when_the_next_run_begins(simulated, tokenizer, tmp_path, again):
    """The Trainer calls no callback when train() raises: in a notebook the job stays open. Re-running the cell (a new
    Trainer, its callback made anew) started a second job beside it on a new model (the higher of two pins, the same
    energy counted twice), or, on the same model, stood down for the old job with a warning of two callbacks on one
    Trainer: the new run's steps went uncounted and the old job never ended. The same callback given a new model
    carried the old job, and the old model's features, on. The new run's job is the only one."""
    daemon, _orin = simulated
    model = tiny_bert(tokenizer.vocab_size)
    first = GovernorCallback(socket=daemon.socket, seq_len=20.0, name="first")
    with pytest.raises(KeyboardInterrupt):
        trainer_for(model, tokenizer, tmp_path, [first, InterruptAt(2)], steps=4).train()
    assert first.job.registered
    old_job = first.job
    second = first if again.startswith("same callback") else GovernorCallback(socket=daemon.socket, seq_len=20.0,
                                                                                name="second")
    if again.endswith("new model"):
        model = tiny_bert(tokenizer.vocab_size)
    names = JobNames(daemon)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GovernorWarning)
        trainer_for(model, tokenizer, tmp_path, [second, names], steps=3).train()
    assert old_job.closed and second.job is not old_job
    assert names.seen == [[second.job.name]] * 3
    ended = re.findall(r"job \d+ '(\w+)' .*ended \(unregistered\) after [\d.]+ s, (\d+) steps", daemon.log())
    assert ended == [("first", "2"), (second.job.name, "3")], daemon.log()
