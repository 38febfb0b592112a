"""A stand-in for a fine-tuning script: a few seconds of CPU "training steps", no GPU, torch or data needed.

    python3 examples/train.py                                    # an unmodified script: govern it with `ftgov run`
    .venv/bin/ftgov run --model-type encoder --num-layers 12 --hidden-size 768 --seq-len 40 -- python3 examples/train.py
    .venv/bin/python examples/train.py --client                  # the same loop registering itself (governor.job)

With --client the loop holds a job through the client library, reporting each step, as a real script would; the
daemon is found through $FTGOV_SOCKET (else /run/ftgov/ftgov.sock), and when it is absent training goes on after
one warning. Without it, nothing of ftgov is imported: that is what `ftgov run` is for.
"""

from __future__ import annotations

import argparse
import contextlib
import time

# BERT-base on a GLUE task, as the README's commands describe it.
FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0}


def train_step(step_s: float) -> float:
    """Busy the CPU for about step_s seconds, as a training step busies the GPU; returns a 'loss'."""
    end = time.perf_counter() + step_s
    acc = 0.0
    while time.perf_counter() < end:
        acc = sum(i * i for i in range(2000)) % 97 + acc * 0.5
    return acc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    p.add_argument("--step-s", type=float, default=0.05, help="seconds per step (default 0.05)")
    p.add_argument("--client", action="store_true", help="register through the client library (governor.job)")
    args = p.parse_args()
    if args.client:
        import governor

        job = governor.job(**FEATURES, name="train.py", total_steps=args.steps)
    else:
        job = contextlib.nullcontext()
    start = time.monotonic()
    with job:
        for _ in range(args.steps):
            train_step(args.step_s)
            if args.client:
                job.step()
    print(f"train.py: {args.steps} steps in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
