"""`ftgov model STAGE`: the model pipeline's stages (characterize, dataset, fit, export, ffg, evaluate; see
governor/pipeline/__init__.py), the same commands as `python -m governor.pipeline STAGE`."""

from __future__ import annotations

from governor.pipeline import add_stage_parsers


def add_parser(sub) -> None:
    p = sub.add_parser("model", help="the model pipeline, one stage at a time (make model chains them)",
                       description=__doc__.split("\n\n")[0])
    add_stage_parsers(p.add_subparsers(dest="stage", required=True, metavar="STAGE"))
