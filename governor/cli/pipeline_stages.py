"""`ftgov characterize`, `ftgov evaluate`: the pipeline stages that are also top-level commands, taken from the
pipeline's stage registry (governor/pipeline/__init__.py), so that each is the same command as `ftgov model STAGE`."""

from __future__ import annotations

from governor.pipeline import add_stage_parsers


def add_parser(sub) -> None:
    add_stage_parsers(sub, top_level_only=True)
