"""`ftgov model retrain`: a board-specific MLG tree from the shipped characterization data plus the board's own
measurement store (docs/store.md has the reasoning; this docstring is the rule).

1-4. Board curves, labels from bracketed minima, their weights against the sweeps, and the board's correction of
   the sweeps: governor/pipeline/board_data.py.
5. Fit: the training grid, leave-one-out CV over every sample with the weights above, chosen by weighted LOOCV energy
   regret (accuracy breaks ties), then fitted on everything. Deterministic for the same stores, data and seed.
6. Report: accuracy and energy regret of the tree the daemon uses now (the one that decided the store's latest job,
   by the version the daemon records with each job: before_tree) and of the new one on the board's own labelled
   workloads, each left out: the correction and the fit (with the chosen hyperparameters) are redone without its
   jobs, so the "after" is on jobs the fit did not see (regret where the pick was not measured: the measured
   neighbour's energy times the corrected sweep's ratio, counted as estimated); and the LOOCV figures.
7. Moves: how many workloads (the characterization sweeps' and the board's) the new tree moves by more than one
   level against the tree in use. The command does not export when more than MAX_MOVED_SHARE of them move, unless
   told to (--force): a change that large is more likely a poisoned store than a board.
   Nor when the store taught nothing (no label, no level corrected): the tree would be the sweeps' alone.
8. Export: ftgov-tree/1 with the provenance (stores, jobs, identity, offsets, figures) in ``metadata`` and a top-level
   ``provenance``; checked by the daemon's own reader, then written to a temporary file and renamed over the target.
   `systemctl reload ftgovd` loads it (set ``model_file`` to it once).

scikit-learn is imported inside the functions: the daemon never imports this module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from governor import data
from governor.config import DEFAULT_STORE_PATH
from governor.errors import FtgovError, ModelError
from governor.features import Features
from governor.pipeline import dataset, train
from governor.pipeline.board_data import (
    BoardCurve,
    Sample,
    board_curves,
    build_samples,
    corrected,
    curve_sample,
    feature_key,
    level_offsets,
    nearest_sweep,
    regret_pct,
)
from governor.pipeline.dataset import Sweep
from governor.safefile import write_file
from governor.simpaths import holds_simulated_tree, missing_store_hint, simulated_store
from governor.units import mhz

if TYPE_CHECKING:
    from governor.policy.tree import DecisionTree


def _design(samples: list[Sample]):
    import numpy as np

    X = np.array([s.features.vector() for s in samples], dtype=np.float64)
    y = np.array([s.label_hz for s in samples], dtype=np.int64)
    w = np.array([s.weight for s in samples], dtype=np.float64)
    return X, y, w


@dataclass(frozen=True)
class WeightedCv:
    params: dict
    accuracy: float
    mean_regret_pct: float


def loocv(samples: list[Sample], params: dict, seed: int) -> WeightedCv:
    import numpy as np

    X, y, w = _design(samples)
    hits = regrets = 0.0
    for i in range(len(samples)):
        keep = np.arange(len(samples)) != i
        est = train.make_estimator(params, seed).fit(X[keep], y[keep], sample_weight=w[keep])
        pred = int(est.predict(X[i: i + 1])[0])
        hits += w[i] * (pred == y[i])
        regrets += w[i] * regret_pct(samples[i], pred)[0]
    total = float(w.sum())
    return WeightedCv(dict(params), hits / total, regrets / total)


def search(samples: list[Sample], seed: int, n_jobs: int = 1) -> WeightedCv:
    from joblib import Parallel, delayed

    candidates = train.grid()
    return train.pick_best(Parallel(n_jobs=n_jobs)(delayed(loocv)(samples, p, seed) for p in candidates))


def fit(samples: list[Sample], params: dict, seed: int):
    X, y, w = _design(samples)
    return train.make_estimator(params, seed).fit(X, y, sample_weight=w)


def tree_decider(tree, levels_hz: tuple[int, ...]) -> Callable[[Features], int]:
    from governor.backends.base import nearest_level

    return lambda f: nearest_level(levels_hz, tree.decide(f).freq_hz)


# ---- the stores ------------------------------------------------------------------------------------------------------

def store_paths(store: str | None, from_dir: str | None) -> list[Path]:
    if from_dir is None:
        return [Path(store or DEFAULT_STORE_PATH)]
    d = Path(from_dir)
    if not d.is_dir():
        raise FtgovError(f"--from {d}: not a directory")
    paths = sorted(p for p in d.rglob("*.sqlite") if p.is_file())
    if not paths:
        raise FtgovError(f"--from {d}: no *.sqlite stores in it")
    return paths


def load_records(paths: list[Path], uids: set[int] | None = None) -> tuple[list, dict]:
    """Every job of every store (of ``uids`` only, when given: the users whose measurements are trusted, since a
    client reports its own step counts), duplicates (the same store copied twice) once; the boards' identity, which
    must be one kind of board, with ``jobs_left_out``: the jobs of other users, and ``latest_tree``: the version and
    source of the tree that decided the latest job of any user (the daemon records them, not the client), or None."""
    from governor.store import measurements as store

    seen, records, kinds, sources, left_out = set(), [], set(), [], 0
    latest = None
    for p in paths:
        conn = store.open_read_only(p)
        try:
            # A row's uid is the word of whoever wrote the file: ftgovd (root) in a store root or this user owns, anyone
            # in a file another user owns, whose rows count as that user's (a member's rows "uid 0" are not root's).
            owner = os.stat(p).st_uid
            vouched = owner in (0, os.geteuid())
            jobs = store.read_jobs(conn)
        except store.BadRow as e:
            raise store.BadRow(f"{p}: {e}: retraining takes no partial store (ftgov history --store shows the rest)") \
                from None
        finally:
            conn.close()
        sources.append({"path": str(p), "jobs": len(jobs)})
        for r in jobs:
            kinds.add((r.board_model, r.gpu_name))  # the daemon records these, whoever ran the job
            if r.model_version is not None and (latest is None or r.ended_at >= latest.ended_at):
                latest = r
            key = (r.boot_id, r.daemon_job_id, r.ended_at, r.board_model, r.name)
            if key in seen:
                continue
            seen.add(key)
            if uids is not None and (r.uid if vouched else owner) not in uids:
                left_out += 1
                continue
            records.append(r)
    if len(kinds) > 1:
        raise FtgovError("the stores come from different kinds of board: "
                         + "; ".join(f"{b or '?'} / {g or '?'}" for b, g in sorted(kinds, key=str))
                         + " (retrain one kind at a time)")
    board, gpu = next(iter(kinds)) if kinds else (None, None)
    l4t = sorted({r.l4t_release for r in records if r.l4t_release})
    latest_tree = None if latest is None else {"model_version": latest.model_version, "source": latest.model_source}
    return records, {"board_model": board, "gpu_name": gpu, "l4t_releases": l4t, "stores": sources,
                     "jobs_left_out": left_out, "latest_tree": latest_tree}


def check_levels(records: list, identity: dict, levels_hz: tuple[int, ...]) -> None:
    """A store whose tuned windows are mostly at levels the characterization data lacks is of another kind of GPU (an
    NVML GPU's, 15 MHz steps; a few of its levels may coincide with the Orin's): the board's curves are compared with
    the sweeps level by level, so its jobs cannot label or correct anything, and the export would be the sweeps' tree
    named "retrained". Refused, saying whose GPU. A board whose table is part of the data's (an Orin NX) passes."""
    windows = [w for r in records for w in r.windows if w.level_hz is not None]
    on = sum(1 for w in windows if w.level_hz in levels_hz)
    if not windows or on * 2 >= len(windows):
        return
    board = " / ".join(x for x in (identity.get("board_model"), identity.get("gpu_name")) if x) or "unknown GPU"
    raise FtgovError(f"only {on} of the {len(windows)} tuned windows in the store are at a level of the "
                     f"characterization data ({board}; the data's levels are "
                     f"{', '.join(mhz(hz, unit=False) for hz in levels_hz)} MHz): retraining corrects those sweeps "
                     "with the board's curves, level by level, so it needs a store of the kind of board the data was "
                     "measured on (characterize this GPU and give the result as --data)")


# ---- the tree in use -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Before:
    """The tree the "before" figures and the moves are measured against, and why it is that one."""

    path: Path
    tree: DecisionTree
    why: str

    def describe(self) -> dict:
        from governor.policy.tree import tree_version

        return {"path": str(self.path), "source": self.tree.source, "model_version": tree_version(self.tree),
                "chosen": self.why}


def before_tree(current: Path | None, candidates: list[Path], latest: dict | None) -> Before:
    """``current`` (--current) when given. Else the tree that decided the store's latest job, found among the
    ``candidates`` (the config's model_file, the shipped tree, the tree retrain writes beside the store) by the version
    the daemon recorded with each job: a daemon started with another config decides with another tree than this
    command's config names. Where the store names no tree (no job, or none decided by a tree), or one none of them is
    (a tree an upgrade replaced, a model_file only another config names), the first candidate, and ``why`` says so:
    the figures and the moves are then against the tree this command's config would have replaced, which the report
    names beside the one the jobs had."""
    from governor.policy.tree import DecisionTree, tree_version  # tree_version: the id the daemon records

    if current is not None:
        tree = DecisionTree.load(current)
        why = "--current"
        if latest is not None and latest["model_version"] != tree_version(tree):
            why += f" (the store's latest job was decided by another tree, {_named(latest)})"
        return Before(current, tree, why)
    if latest is None:
        return Before(candidates[0], DecisionTree.load(candidates[0]), "the store names no tree that decided a job")
    seen, loaded = [], {}
    for path in candidates:
        try:
            tree = loaded[path] = DecisionTree.load(path)
        except ModelError as e:
            seen.append(f"{path} ({e})")
            continue
        if tree_version(tree) == latest["model_version"]:
            return Before(path, tree, "it decided the store's latest job")
        seen.append(f"{path} ({tree_version(tree)})")
    first = loaded.get(candidates[0]) or DecisionTree.load(candidates[0])  # not loaded: its error, as without a store
    return Before(candidates[0], first,
                  f"the store's latest job was decided by the tree {_named(latest)}, which is none of "
                  f"{'; '.join(seen)} (give the tree the daemon decides with as --current FILE, or the config it was "
                  "started with as --config)")


def _named(latest: dict) -> str:
    return f"{latest['model_version']} (source {latest['source'] or 'unknown'})"


def tree_candidates(model_file: str | None, paths: list[Path], from_dir: str | None) -> list[Path]:
    from governor.config import default_model_path

    found = [Path(model_file)] if model_file else []
    found.append(default_model_path())
    if from_dir is None:
        found.append(paths[0].with_name("mlg-tree.json"))  # where retrain writes by default
    return [p for i, p in enumerate(found) if p not in found[:i] and (i == 0 or p.is_file())]


# ---- the whole stage -------------------------------------------------------------------------------------------------

@dataclass
class Result:
    estimator: object
    report: dict
    samples: list[Sample]


MAX_MOVED_SHARE = 0.5


def held_out_picks(curves: list[BoardCurve], user_curves: list[BoardCurve], sweeps: list[Sweep], params: dict,
                   seed: int, correct: bool = True) -> list[tuple[BoardCurve, int, list[Sweep]]]:
    """For each labelled board workload: (curve, the pick of a tree fitted without its jobs, the sweeps as that fit
    corrected them). Its jobs leave the correction too: a workload must not vouch for itself."""
    out = []
    for c in curves:
        if c.label_hz is None:
            continue
        key = feature_key(c.features)
        rest = [x for x in curves if feature_key(x.features) != key]
        offsets = offsets_of([x for x in user_curves if feature_key(x.features) != key], sweeps, correct)
        estimator = fit(build_samples(sweeps, rest, offsets), params, seed)
        out.append((c, int(estimator.predict([c.features.vector()])[0]), corrected(sweeps, offsets)))
    return out


def score_held_out(decide: Callable[[Features], int] | None, held_out: list) -> dict:
    """Accuracy and energy regret on the board's labelled workloads; ``decide`` None: the held-out picks."""
    if not held_out:
        return {"curves": 0, "accuracy": None, "mean_regret_pct": None, "estimated": 0}
    hits, regrets, estimated = 0, [], 0
    for i, (c, held_out_pick, fixed) in enumerate(held_out):
        pick = held_out_pick if decide is None else decide(c.features)
        r, est = regret_pct(curve_sample(c, nearest_sweep(c.features, fixed), i), pick)
        hits += pick == c.label_hz
        regrets.append(r)
        estimated += est
    return {"curves": len(held_out), "accuracy": round(hits / len(held_out), 4),
            "mean_regret_pct": round(sum(regrets) / len(regrets), 3), "estimated": estimated}


def moved(old: Callable[[Features], int], new: Callable[[Features], int], workloads: list[Features],
          levels_hz: tuple[int, ...]) -> dict:
    """How many of ``workloads`` the new decision moves by more than one level of the table against the old."""
    from governor.backends.base import nearest_level

    def index(hz: int) -> int:
        return levels_hz.index(nearest_level(levels_hz, hz))

    far = sum(1 for f in workloads if abs(index(new(f)) - index(old(f))) > 1)
    return {"workloads": len(workloads), "more_than_one_level": far}


def offsets_of(user_curves: list[BoardCurve], sweeps: list[Sweep], correct: bool) -> dict[int, float]:
    return level_offsets(user_curves, sweeps) if correct else {hz: 0.0 for hz in sweeps[0].levels_hz}


def retrain(records: list, sweeps: list[Sweep], seed: int = 0, current_tree=None, n_jobs: int = 1,
            correct: bool = True) -> Result:
    """``correct=False`` leaves the sweeps as shipped (for measuring what the correction is worth)."""
    levels = sweeps[0].levels_hz
    # The tree splits on gpu_util: a workload whose load was never known cannot label it, nor be compared with it.
    curves = [c for c in board_curves(records, levels) if c.features.gpu_util is not None]
    user_curves = [c for c in board_curves(records, levels, by_uid=True) if c.features.gpu_util is not None]
    offsets = offsets_of(user_curves, sweeps, correct)
    samples = build_samples(sweeps, curves, offsets)
    best = search(samples, seed, n_jobs)
    estimator = fit(samples, best.params, seed)

    def new_decide(f: Features) -> int:
        return int(estimator.predict([f.vector()])[0])

    held_out = held_out_picks(curves, user_curves, sweeps, best.params, seed, correct)
    current = tree_decider(current_tree, levels) if current_tree is not None else None
    workloads = list({feature_key(f): f for f in [s.features for s in sweeps] + [c.features for c in curves]}.values())
    report = {
        "seed": seed, "hyperparameters": best.params,
        "loocv_accuracy": round(best.accuracy, 4), "loocv_mean_regret_pct": round(best.mean_regret_pct, 3),
        "jobs": len(records), "tuned_jobs": sum(1 for r in records if r.windows),
        "uids": sorted({r.uid for r in records}, key=lambda u: (u is None, u)),
        "board_curves": len(curves), "labelled_curves": len(held_out),
        "board_weight": round(sum(c.weight for c in curves if c.label_hz is not None), 3),
        "sweeps_used": sum(1 for s in samples if not s.name.startswith("board/")), "sweeps": len(sweeps),
        "level_log_offsets": {str(hz): round(v, 5) for hz, v in offsets.items()},
        "after": score_held_out(None, held_out),
        "before": score_held_out(current, held_out) if current is not None else None,
        "moved": moved(current, new_decide, workloads, levels) if current is not None else None,
    }
    return Result(estimator, report, samples)


def export_tree(result: Result, out: Path, provenance: dict) -> str:
    """Write the ftgov-tree/1 export atomically (temp file in the same directory, fsync, rename); its model_id."""
    from governor.pipeline import export
    from governor.policy.tree import DecisionTree

    nodes = export.tree_nodes(result.estimator)
    model_id = "retrained-" + hashlib.sha256(json.dumps(nodes, sort_keys=True).encode()).hexdigest()[:12]
    r = result.report
    metadata = {"model_id": model_id, "seed": r["seed"], "hyperparameters": r["hyperparameters"],
                "loocv_accuracy": r["loocv_accuracy"], "loocv_mean_regret_pct": r["loocv_mean_regret_pct"],
                "label": "characterization sweeps (corrected by the board's level offsets, 1-2-1 smoothed optimum) "
                         "and the board's bracketed minima, weighted (governor/pipeline/retrain.py)",
                "gpu_util": "GPU load under MAXN (the board's default governor), percent",
                "thresholds": "float64 equivalents of scikit-learn's float32 comparisons "
                              "(see governor/pipeline/export.py)",
                "retrained": {k: v for k, v in r.items() if k not in ("seed", "hyperparameters")}}
    description = (f"MLG tree retrained on the board's measurement store ({r['labelled_curves']} labelled workloads "
                   f"from {r['tuned_jobs']} tuned jobs) and {r['sweeps_used']} characterization sweeps.")
    doc = json.loads(export.to_json(result.estimator, description, metadata))
    doc["source"] = "retrained"
    doc["provenance"] = provenance
    DecisionTree.from_dict(doc)  # what the daemon will read: never install a tree it would refuse
    # The daemon reads it (0644; it holds nothing secret). Written through the checked directory's descriptor with
    # fchmod, never chmod by path: root retrains into directories others may own (governor/safefile.py).
    write_file(out, json.dumps(doc, indent=1, sort_keys=False) + "\n", 0o644)
    return model_id


# ---- command line ----------------------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("retrain", help="retrain the MLG tree from the board's measurement store",
                       description="Retrain the MLG tree from what this board measured: the store's bracketed minima "
                                   "join the characterization sweeps, which are corrected by the board's per-level "
                                   "departure from them; prints accuracy and regret before and after on the board's "
                                   "own jobs and writes the tree with its provenance (docs/store.md).")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--store", help="the board's store (default: the one beside $FTGOV_SIM_TREE or a simulated "
                     f"daemon's $FTGOV_SOCKET when set and no --config is given, else {DEFAULT_STORE_PATH})")
    src.add_argument("--from", dest="from_dir", metavar="DIR",
                     help="merge every *.sqlite store under DIR (copied from many boards of one kind)")
    p.add_argument("--data", type=Path, help="the characterization CSV (default: the one shipped with ftgov)")
    p.add_argument("--current", type=Path, help="the tree the board uses now, for the before figures and the moves "
                   "(default: the one that decided the store's latest job, as the store records it: model_file of "
                   "--config or of the installed config, the shipped tree, or mlg-tree.json beside the store)")
    p.add_argument("--config", help="ftgovd's config, for model_file and store.path")
    p.add_argument("--out", type=Path, help="where to write the tree (default: mlg-tree.json beside the store)")
    p.add_argument("--uid", type=int, action="append", default=[], metavar="UID",
                   help="learn from this user's jobs too (repeatable; default root's only): a client reports its own "
                        "step counts, so name only the users you trust")
    p.add_argument("--force", action="store_true",
                   help=f"export even when the new tree moves more than {MAX_MOVED_SHARE * 100:.0f}%% of the "
                        "workloads by more than one level against the tree in use")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="joblib workers for the LOOCV search")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """An FtgovError is printed by the command's entry (governor.cli.run_command), as for every stage."""
    try:
        return _run(args)
    except OSError as e:  # writing the tree
        raise FtgovError(f"cannot write {e.filename or 'the tree'}: {e.strerror or e}") from e


def _run(args: argparse.Namespace) -> int:
    from governor.store.measurements import StoreMissing

    store_path, model_file = args.store, None
    if store_path is None and args.from_dir is None and args.config is None:
        store_path = simulated_store()  # the shell was pointed at ftgovd --simulate: its store, not the board's
    if args.config or args.current is None or store_path is None:
        from governor import DEFAULT_CONFIG_PATH
        from governor.config import installed_store_path, load_config

        cfg = load_config(args.config or DEFAULT_CONFIG_PATH, must_exist=args.config is not None)
        store_path = store_path or (installed_store_path(cfg) if not args.from_dir else None)
        model_file = cfg.model_file
    if args.data is None:
        args.data = data.path(data.CHARACTERIZATION)
    paths = store_paths(store_path, args.from_dir)
    trusted = {0, *args.uid}
    try:
        records, identity = load_records(paths, trusted)
    except StoreMissing as e:
        if args.store or args.from_dir:  # a path given: the message names it
            raise
        raise StoreMissing(f"{e} ({missing_store_hint(args.config is None and simulated_store() is None)})") from e
    identity["trusted_uids"] = sorted(trusted)
    sweeps = dataset.load(args.data)
    check_levels(records, identity, sweeps[0].levels_hz)
    # Said before the search (a minute or more on a board's CPUs), not after it.
    out = (args.out or paths[0].with_name("mlg-tree.json")) if args.from_dir is None else args.out
    if out is None:
        raise FtgovError("--from needs --out: where to write the fleet's tree")
    if not records:
        raise FtgovError(f"not exported: nothing to learn from in the store: no jobs of the trusted users; "
                         f"{identity['jobs_left_out']} jobs of other users left out (--uid UID learns from a user's "
                         "jobs, docs/security.md)")
    before = before_tree(args.current, tree_candidates(model_file, paths, args.from_dir), identity["latest_tree"])
    result = retrain(records, sweeps, args.seed, before.tree, args.jobs)
    provenance = {**identity, "data": args.data.name, "data_sha256": dataset.sha256(args.data),
                  "replaces": {**before.describe(), "model_id": before.tree.metadata.get("model_id")}}
    r = result.report
    m = r["moved"]
    learnt = r["labelled_curves"] > 0 or any(r["level_log_offsets"].values())
    refused = not learnt or m["more_than_one_level"] > MAX_MOVED_SHARE * m["workloads"] and not args.force
    model_id = None if refused else export_tree(result, out, provenance)
    if args.json:
        print(json.dumps({"out": None if refused else str(out), "model_id": model_id, **identity, **r,
                          "before_tree": before.describe()}, indent=2))
    else:
        _print_report(result, identity, len(paths), before)
    if not learnt:
        # The fit would be the sweeps' alone: a tree called retrained that the operator installs as the board's.
        raise FtgovError(f"not exported: nothing to learn from in the store: {r['tuned_jobs']} tuned jobs used, none "
                         f"with a bracketed minimum nor agreeing on a level's correction; "
                         f"{identity['jobs_left_out']} jobs of other users left out (--uid UID learns from a user's "
                         "jobs, docs/security.md)")
    if refused:
        raise FtgovError(f"not exported: the new tree moves {m['more_than_one_level']} of {m['workloads']} workloads "
                         "(the characterization set's and the board's) by more than one level against the tree in "
                         "use; check the store's jobs (ftgov history), or pass --force")
    if not args.json:
        reload = ("send ftgovd --simulate a SIGHUP (kill -HUP its pid; it reads its --config's model_file again)"
                  if holds_simulated_tree(paths[0].parent) else "run `systemctl reload ftgovd`")
        print(f"wrote {out} ({model_id}); point model_file at it and {reload}")
    return 0


def _print_report(result: Result, identity: dict, stores: int, before: Before) -> None:
    r = result.report
    print(f"{r['jobs']} jobs from {stores} store(s) ({identity['board_model'] or 'unknown board'}): "
          f"{r['tuned_jobs']} tuned, {r['board_curves']} workloads, {r['labelled_curves']} with a bracketed minimum")
    used = ", ".join(map(str, r["uids"])) or "nobody"
    print(f"trusted: uid {', '.join(map(str, identity['trusted_uids']))} (root and --uid); jobs used: uid {used}; "
          f"{identity['jobs_left_out']} jobs of other users left out")
    print(f"LOOCV over {len(result.samples)} samples: accuracy {r['loocv_accuracy']:.3f}, mean energy regret "
          f"{r['loocv_mean_regret_pct']:.2f}%; chosen {json.dumps(r['hyperparameters'], sort_keys=True)}")
    b = before.describe()
    print(f"the tree in use: {b['path']} ({b['source']}, {b['model_version']}): {b['chosen']}")
    for key, name in (("before", "before (the tree in use)"), ("after", "after (each left out)")):
        s = r[key]
        if s is None or not s["curves"]:
            print(f"  {name:24} no labelled board workloads to score on")
            continue
        print(f"  {name:24} on the board's {s['curves']} labelled workloads: accuracy {s['accuracy']:.3f}, "
              f"mean energy regret {s['mean_regret_pct']:.2f}% ({s['estimated']} estimated from the sweep's shape)")
    m = r["moved"]
    print(f"  moved by more than one level against the tree in use: {m['more_than_one_level']} of {m['workloads']} "
          "workloads")

