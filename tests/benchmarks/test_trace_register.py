"""benchmarks.trace_register's floor figures on made-up traces: a call up to a floor above is found, a return is not
one."""

from __future__ import annotations

from benchmarks.trace_register import floor_figures


def test_a_call_down_and_back_is_no_call_up_but_a_callback_into_a_floor_above_is():
    down_and_back = [("daemon/rpc.py", "rpc_register", 1), ("daemon/holds.py", "register", 2),
                     ("daemon/controller.py", "register", 3), ("policy/tree.py", "decide", 4),
                     ("daemon/gpupin.py", "set", 4), ("backends/devfreq.py", "pin", 5),
                     ("daemon/holds.py", "hold", 3), ("units.py", "mhz", 3)]
    fl = floor_figures(down_and_back)
    assert fl == {"path": "rpc, holds, controller, policy, GPU pin, backend", "up": []}
    callback = [*down_and_back[:5], ("daemon/jobtable.py", "records", 5), ("features.py", "vector", 6),
                ("daemon/rpc.py", "late", 7)]
    assert floor_figures(callback)["up"] == ["GPU pin -> controller (records)", "controller -> rpc (late)"]
