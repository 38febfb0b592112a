"""protocol.parse_line: every malformed line becomes an RpcFault with the right code and field."""

import json

import pytest

from governor import errors
from governor.daemon import protocol
from governor.daemon.protocol import RpcFault
from governor.features import Features

FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0}


def line(**msg) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **msg}).encode()


def fault(raw: bytes) -> RpcFault:
    with pytest.raises(RpcFault) as e:
        protocol.parse_line(raw)
    return e.value


def test_a_good_register_is_typed():
    req = protocol.parse_line(line(id=7, method="register", params={**FEATURES, "name": "bert", "gpu": 0}))
    assert (req.id, req.method, req.is_notification) == (7, "register", False)
    assert req.params.name == "bert" and Features.of(req.params).gpu_util is None


def test_a_notification_has_no_id():
    req = protocol.parse_line(line(method="progress", params={"job_id": 1, "steps": 10}))
    assert req.is_notification and req.params.steps == 10


@pytest.mark.parametrize("raw, code, field", [
    (b"\xff\xfe", errors.PARSE_ERROR, None),
    (b"{not json", errors.PARSE_ERROR, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": NaN}}', errors.PARSE_ERROR, None),
    (b"[1, 2]", errors.INVALID_REQUEST, None),
    (line(id=True, method="ping"), errors.INVALID_REQUEST, "id"),
    (json.dumps({"jsonrpc": "1.0", "id": 1, "method": "ping"}).encode(), errors.INVALID_REQUEST, "jsonrpc"),
    (line(id=1, method="ping", extra=1), errors.INVALID_REQUEST, "extra"),
    (line(id=1, method="reboot"), errors.METHOD_NOT_FOUND, "method"),
    (line(id=1, method="register", params=[1]), errors.INVALID_PARAMS, "params"),
    (line(id=1, method="register", params={**FEATURES, "num_layers": -1}), errors.INVALID_PARAMS, "num_layers"),
    (line(id=1, method="register", params={**FEATURES, "gpu": True}), errors.INVALID_PARAMS, "gpu"),
    (line(id=1, method="progress", params={"job_id": 1, "steps": 1, "phase": "nap"}), errors.INVALID_PARAMS, "phase"),
    (line(id=1, method="update", params={"job_id": 1, "gpu_util": 101}), errors.INVALID_PARAMS, "gpu_util"),
    *[(line(id=1, method="progress", params={"job_id": 1, "steps": 1, "step_end_s": bad}), errors.INVALID_PARAMS,
       "step_end_s") for bad in (-1.0, "12.5", True, 2.0 ** 41, [1.0])],
])
def test_bad_lines_get_the_right_code_and_field(raw, code, field):
    e = fault(raw)
    assert e.code == code, e.message
    assert (e.data or {}).get("field") == field


def test_a_readable_id_is_carried_for_the_error_reply():
    assert fault(line(id="abc", method="nope")).data["id"] == "abc"


def test_a_notification_with_a_bad_method_is_answered_by_nobody():
    assert fault(line(method="nope")).data["notification"] is True


def test_a_lone_surrogate_in_a_name_is_replaced_not_refused():
    req = protocol.parse_line(b'{"jsonrpc":"2.0","id":1,"method":"register","params":{"model_type":"encoder",'
                              b'"num_layers":2,"hidden_size":64,"seq_len":8,"name":"a\\ud800"}}')
    assert req.params.name == "a\ufffd"


def test_the_error_reply_hides_the_internal_fields():
    reply = json.loads(protocol.error(3, RpcFault(errors.INVALID_PARAMS, "x", {"field": "f", "id": 3,
                                                                            "notification": False})))
    assert reply == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "x", "data": {"field": "f"}}}
