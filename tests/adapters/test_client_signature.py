"""One client signature: governor.job's keywords are what the Hugging Face and Lightning callbacks take and forward
whole, so that an option added to the job reaches every adapter (they could not pass tune, gpu or pid before)."""

from __future__ import annotations

import inspect
import warnings

import pytest

from governor.client import AdapterCore, Job, job

FEATURES = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40)


def test_an_adapter_passes_every_job_option_through(tmp_path):
    core = AdapterCore(**FEATURES, tune=True, gpu=1, pid=4242, socket=str(tmp_path / "none.sock"), name="mine",
                       report_every_s=0.5, measure_batches=3, timeout_s=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no daemon: the job warns and does nothing
        assert core._start(None, "default-name", total_steps=100)
    j = core.job
    assert (j.tune, j.gpu, j.pid, j.name, j.report_every_s, j.measure_batches, j.timeout_s, j.total_steps) == (
        True, 1, 4242, "mine", 0.5, 3, 2.0, 100)
    assert j.features["num_layers"] == 12 and j.disabled


def test_every_option_of_a_job_is_an_option_of_the_adapters():
    job_options = set(inspect.signature(Job).parameters) - {"features"}
    for name in job_options:
        AdapterCore(**{name: inspect.signature(Job).parameters[name].default})
    assert set(inspect.signature(job).parameters) >= {"model", "model_type", "num_layers", "hidden_size", "seq_len",
                                                      "gpu_util"}


def test_a_misspelt_or_bad_option_fails_when_the_callback_is_made():
    with pytest.raises(TypeError):
        AdapterCore(tuen=True)
    with pytest.raises(ValueError, match="num_layers"):
        AdapterCore(num_layers=0)
    with pytest.raises(TypeError):
        job(None, **FEATURES, tuen=True)
