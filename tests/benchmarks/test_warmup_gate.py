"""Real cold starts (benchmarks/data/h100-warmup) replayed through the daemon's warm-up gate and baseline parts
(benchmarks/warmup_gate.py): what docs/benchmarks.md's "warmup-gate" and docs/tuner.md say of them."""

from __future__ import annotations

from benchmarks.warmup_gate import WARMUP_TRACES, replay, runs
from governor.config import TunerConfig


def test_the_gate_opens_on_every_cold_start_and_a_slow_fade_is_left_out_of_the_baseline():
    rows = {(d.name, name): replay(d, name, TunerConfig(), 20, 1.0) for d, name in runs(WARMUP_TRACES)}
    assert len(rows) == 13 and all(r["gate"] is not None for r in rows.values())
    kept_out = rows[("r3", "bert-small-L6H512")]  # a warm-up the gate waited out
    assert kept_out["gate"] > kept_out["settled"] and kept_out["no_gate"] > 0.1 and abs(kept_out["gated"]) < 0.01
    faded = rows[("r1", "bert-small-L6H512")]
    assert faded["settled"] > faded["gate"] and faded["gated"] > 0.2  # the fade the gate does not see
    assert faded["all_parts"] > 0.05 and abs(faded["baseline"]) < 0.01  # the stray first part left out
    others = [r for key, r in rows.items() if key != ("r1", "bert-small-L6H512") and r["baseline"] is not None]
    assert others and all(r["baseline"] == r["all_parts"] and abs(r["baseline"]) < 0.02 for r in others)
