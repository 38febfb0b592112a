"""A job's features are bounded to physical ranges at the protocol, and nothing root runs on what the protocol accepts
(the Prometheus exporter, `ftgov history`, `ftgov report`) raises on it. The attack: ``seq_len: 5e-324`` was valid
(> 0), and the exporter's savings estimate divided by zero on every scrape while the job lived."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.cli import history, report
from governor.cli.metrics import DaemonCollector, families, model_savings_estimator
from governor.client import check_features
from governor.daemon.protocol import RpcFault, parse_line
from governor.errors import INVALID_PARAMS, PARSE_ERROR
from governor.features import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_SEQ_LEN, MIN_SEQ_LEN, Features
from governor.safefile import OutDir
from governor.store.measurements import JobRecord, Window, no_totals
from tests.support.daemon import FEATURES

prometheus_client = pytest.importorskip("prometheus_client")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

LEVELS_HZ = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000, 1122000000,
             1224000000, 1300500000)


def _floats(low: float, high: float):
    """Anywhere in the accepted range (its ends and the smallest steps past them included), and anything at all."""
    return st.one_of(st.floats(low, high), st.sampled_from([low, high, math.nextafter(low, -math.inf),
                                                            math.nextafter(high, math.inf), 5e-324, 0.0, -1.0]),
                     st.floats(allow_nan=True, allow_infinity=True))


def _ints(low: int, high: int):
    return st.one_of(st.integers(low, high), st.sampled_from([low, high, low - 1, high + 1]), st.integers())


FEATURE_VALUES = st.fixed_dictionaries({
    "model_type": st.sampled_from(["encoder", "decoder"]),
    "num_layers": _ints(1, MAX_LAYERS),
    "hidden_size": _ints(1, MAX_HIDDEN_SIZE),
    "seq_len": _floats(MIN_SEQ_LEN, MAX_SEQ_LEN),
    "gpu_util": _floats(0.0, 100.0),
})


def _register_line(features: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": features}).encode()


def _status(features: dict, freq_hz: int, energy_j: float, steps: int) -> dict:
    """A status answer as governor/daemon/status.py builds it, with one job of these features."""
    job = {"job_id": 1, "name": "bert", "pid": 10, "uid": 1000, "gpu": "0", "policy": "mlg", "freq_hz": freq_hz,
           "reason": "MLG tree", "features": features, "duration_s": 12.5, "steps": steps, "total_steps": None,
           "phase": "train", "energy_j": energy_j, "adopted": False, "tuner": None,
           "saving": {"saved_rel": 0.1, "measured_steps": 40}}
    return {"policy": "mlg", "jobs": [job], "power_mw": {"VDD_GPU_SOC": 9000.0}, "energy_rails": ["VDD_GPU_SOC"],
            "gpus": [{"id": "0", "backend": "devfreq", "cur_hz": freq_hz, "min_hz": freq_hz, "max_hz": freq_hz,
                      "pinned_hz": freq_hz,
                      "load_pct": features["gpu_util"]}],
            "store": {**no_totals(), "jobs": 3, "energy_j": energy_j, "saved_j": 1.0, "saved_start_j": 1.0,
                      "error": None}}


class _StatusCollector(DaemonCollector):
    """The exporter's collector, over a status answer instead of a socket."""

    def __init__(self, status: dict):
        super().__init__(None, model_savings_estimator())
        self.status = status

    def collect(self):
        yield from self.gauges(self.status)


def _exposition(status: dict) -> str:
    registry = prometheus_client.CollectorRegistry()
    registry.register(_StatusCollector(status))
    return prometheus_client.generate_latest(registry).decode()


def _record(features: dict, freq_hz: int, energy_j: float, steps: int) -> JobRecord:
    return JobRecord(ended_at=1_790_000_000.0, duration_s=12.5, uid=1000, name="bert", policy="tuned",
                     freq_hz=freq_hz, steps=steps, energy_j=energy_j, saved_rel=0.1, saved_basis="default governor",
                     levels_hz=json.dumps(LEVELS_HZ), **features,
                     windows=(Window(None, 1.2, 0.1, 8), Window(freq_hz, 1.0, 0.12, 8)))


@settings(max_examples=300, deadline=None)
@given(features=FEATURE_VALUES, freq_hz=st.sampled_from(LEVELS_HZ), energy_j=st.floats(0, 1e9),
       steps=st.integers(0, 1 << 62))
def test_what_the_protocol_accepts_the_exporter_history_and_report_render(tmp_path_factory, features, freq_hz,
                                                                         energy_j, steps):
    try:
        request = parse_line(_register_line(features))
    except RpcFault as e:
        non_finite = [k for k, v in features.items() if isinstance(v, float) and not math.isfinite(v)]
        if e.code == PARSE_ERROR:  # NaN and Infinity are not JSON
            assert non_finite, e.message
            field = non_finite[0]
        else:
            assert e.code == INVALID_PARAMS and e.data["field"] in features, (e.message, e.data)
            field = e.data["field"]
        with pytest.raises(ValueError, match=field):  # the client refuses it too, before sending it
            check_features(features)
        return
    accepted = Features.of(request.params).model_dump()
    assert check_features(features).model_dump() == accepted
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in prometheus_parser.text_string_to_metric_families(_exposition(_status(accepted, freq_hz,
                                                                                                energy_j, steps)))
               for s in fam.samples}
    assert samples[("ftgov_up", ())] == 1
    assert ("ftgov_job_energy_savings_ratio_estimate", (("gpu", "0"), ("job_id", "1"))) in samples
    assert all(not math.isnan(v) for v in samples.values()), samples

    record = _record(accepted, freq_hz, energy_j, steps)
    totals = {**no_totals(), "jobs": 1, "energy_j": energy_j, "saved_j": record.saved_j or 0.0}
    assert "1 job(s) listed" in history.format_table([record], totals)
    groups = report.workloads([record])
    path = tmp_path_factory.mktemp("report")
    with OutDir(path) as out:
        report._summary(groups, totals, out)
    assert (path / "summary.csv").read_text().count("\n") == 2


def test_the_attack_value_is_refused_naming_the_field():
    for params, field in (({**FEATURES, "seq_len": 5e-324}, "seq_len"), ({**FEATURES, "seq_len": 0.5}, "seq_len"),
                          ({**FEATURES, "num_layers": MAX_LAYERS + 1}, "num_layers"),
                          ({**FEATURES, "hidden_size": MAX_HIDDEN_SIZE + 1}, "hidden_size"),
                          ({**FEATURES, "seq_len": MAX_SEQ_LEN * 2}, "seq_len")):
        with pytest.raises(RpcFault) as err:
            parse_line(_register_line(params))
        assert err.value.code == INVALID_PARAMS and err.value.data["field"] == field
    line = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "update", "params": {"job_id": 1, "seq_len": 5e-324}})
    with pytest.raises(RpcFault) as err:
        parse_line(line.encode())
    assert err.value.data["field"] == "seq_len"


def test_the_real_daemon_refuses_a_denormal_seq_len_and_its_exporter_renders_the_largest_job(start_daemon):
    d = start_daemon()
    c = d.client()
    for method, params in (("register", {**FEATURES, "seq_len": 5e-324}), ("predict", {**FEATURES, "seq_len": 0.5})):
        err = c.request(method, **params)["error"]
        assert err["code"] == INVALID_PARAMS and err["data"]["field"] == "seq_len", err
    largest = {"model_type": "decoder", "num_layers": MAX_LAYERS, "hidden_size": MAX_HIDDEN_SIZE,
               "seq_len": MIN_SEQ_LEN, "gpu_util": 100.0}
    job_id = c.call("register", **largest)["job_id"]
    err = c.request("update", job_id=job_id, seq_len=5e-324)["error"]
    assert err["code"] == INVALID_PARAMS and err["data"]["field"] == "seq_len", err
    registry = prometheus_client.CollectorRegistry()
    registry.register(DaemonCollector(d.socket, model_savings_estimator()))
    text = prometheus_client.generate_latest(registry).decode()
    assert f'ftgov_job_energy_savings_ratio_estimate{{gpu="0",job_id="{job_id}"}}' in text
    assert families(c.call("status"))[0].samples == [({}, 1.0)]


def test_the_client_refuses_an_out_of_range_update_before_sending_it():
    from governor.client import Job

    job = Job(dict(FEATURES))
    with pytest.raises(ValueError, match="seq_len"):
        job.update(seq_len=5e-324)
    with pytest.raises(ValueError, match="gpu_util"):
        job.update(gpu_util=math.nan)
    assert job.features["seq_len"] == FEATURES["seq_len"]


@pytest.mark.parametrize("args, field", [(["--seq-len", "5e-324"], "seq_len"), (["--num-layers", "1001"], "num_layers"),
                                         (["--hidden-size", str(MAX_HIDDEN_SIZE + 1)], "hidden_size")])
def test_the_cli_refuses_out_of_range_features_in_one_line(args, field, capsys, tmp_path):
    from governor.cli import main

    shape = {"--model-type": "encoder", "--num-layers": "12", "--hidden-size": "768", "--seq-len": "40"}
    shape.update(dict(zip(args[::2], args[1::2], strict=True)))
    argv = ["predict", "--socket", str(tmp_path / "none.sock"), *(x for kv in shape.items() for x in kv)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err
