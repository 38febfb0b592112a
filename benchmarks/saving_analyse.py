"""Experiment (docs/exp-saving-estimator.md): the measured saving's error on saving_dump's jobs, decomposed, and
alternative estimators of it evaluated on the very same jobs.

    python -m benchmarks.saving_analyse /tmp/dump.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict

from benchmarks.figures import pct as percentile
from governor.policy.measured_saving import pooled
from governor.policy.windows import Measurement


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def summary(errs, sds=None):
    """mean abs / p99 abs (points), within 1 and 2 s.d. where given."""
    a = [100 * abs(e) for e in errs]
    rms = 100 * math.sqrt(statistics.mean(e * e for e in errs))
    out = f"{statistics.mean(a):.2f} / {percentile(a, 99):.2f} (rms {rms:.2f})"
    if sds is not None:
        w1 = sum(abs(e) <= s for e, s in zip(errs, sds, strict=True)) / len(errs)
        w2 = sum(abs(e) <= 2 * s for e, s in zip(errs, sds, strict=True)) / len(errs)
        out += f", within {100 * w1:.0f}% / {100 * w2:.0f}%"
    return out


def rel_summary(xs):
    a = [100 * abs(x) for x in xs]
    rms = 100 * math.sqrt(statistics.mean(x * x for x in xs))
    return f"rms {rms:.2f}%, p99 {percentile(a, 99):.2f}%, mean {100 * statistics.mean(xs):+.2f}%"


def pooled_parts(job):
    """The baseline's parts the daemon pooled (a stray first part left out)."""
    return job["parts"][len(job["parts"]) - job["pooled_parts"]:]


def pooled_j(items):
    """J/step and its relative s.d. of windows pooled as the daemon pools the baseline's parts
    (governor.policy.measured_saving.pooled); a window of unknown noise counts as noise_rel 0.03."""
    m = pooled([Measurement(None, i["j"], i["s"], i["n"], i["n"], i["noise"] or 0.03) for i in items])
    return m.joules_per_step, m.noise_rel


def baseline_side(job):
    """The pooled baseline's steps, s/step and power (its J/step over its s/step)."""
    parts = pooled_parts(job)
    nb = sum(p["n"] for p in parts)
    sb = sum(p["s"] * p["n"] for p in parts) / nb
    return nb, sb, job["saving"]["baseline_j_per_step"] / sb


def tuned_side(job):
    """J/step and s/step over the stretches at the pick and its confirmation windows, and the steps."""
    best = job["best_hz"]
    st = [s for s in job["stretches"] if s["level"] == best and s["last"][0] > s["first"][0]]
    cw = [m for m in job["at_pick"] if m["level"] == best]
    n = sum(s["last"][0] - s["first"][0] for s in st) + sum(m["n"] for m in cw)
    j = sum(s["last"][1] - s["first"][1] for s in st) + sum(m["j"] * m["n"] for m in cw)
    t = sum(s["last"][2] - s["first"][2] for s in st) + sum(m["s"] * m["n"] for m in cw)
    if n <= 0 or job["saving"].get("tuned_over", "steps after convergence") != "steps after convergence":
        ws = [m for m in job["windows"] if m["level"] == best]
        n = sum(m["n"] for m in ws)
        j = sum(m["j"] * m["n"] for m in ws)
        t = sum(m["s"] * m["n"] for m in ws)
    return j / n, t / n, n


def decompose(jobs):
    rows = defaultdict(list)
    for job in jobs:
        sv = job["saving"]
        if sv is None:
            continue
        i_top = len(job["levels"]) - 1
        i_pick = job["levels"].index(job["best_hz"])
        E_top, t_top = job["E"][i_top], job["t"][i_top]
        E_p, t_p = job["E"][i_pick], job["t"][i_pick]
        Jb, Jt = sv["baseline_j_per_step"], sv["tuned_j_per_step"]
        parts = pooled_parts(job)
        w = [p["n"] for p in parts]
        sb = sum(p["s"] * p["n"] for p in parts) / sum(w)  # pooled as `pooled` does without spans
        if job["added"]:
            sb = float("nan")
        Jt2, st, nt = tuned_side(job)
        true = job["true"]
        rows["err"].append(sv["saved_rel"] - true)
        rows["sd"].append(sv["saved_pct_err"] / 100)
        rows["err_base_only"].append((1 - E_p / Jb) - true)
        rows["err_tuned_only"].append((1 - Jt / E_top) - true)
        rows["base_J"].append(Jb / E_top - 1)
        rows["base_t"].append(sb / t_top - 1)
        rows["base_P"].append((Jb / sb) / (E_top / t_top) - 1)
        rows["tuned_J"].append(Jt / E_p - 1)
        rows["tuned_t"].append(st / t_p - 1)
        rows["tuned_P"].append((Jt / st) / (E_p / t_p) - 1)
        # counterfactuals: the baseline's time exact (its power measured), its power exact (its time measured)
        rows["err_base_P_only"].append((1 - E_p / ((Jb / sb) * t_top)) - true)
        rows["err_base_t_only"].append((1 - E_p / ((E_top / t_top) * sb)) - true)
        rows["base_steps"].append(sv["baseline_steps"])
        rows["tuned_steps"].append(nt)
        rows["base_rel_stated"].append(sv["baseline_rel"])
        rows["tuned_rel_stated"].append(sv["tuned_rel"])
    return rows


def report_decomposition(jobs, label):
    r = decompose(jobs)
    print(f"\n== {label}: {len(r['err'])} jobs with a saving ==")
    print("measured - true (points), as reported:", summary(r["err"], r["sd"]))
    print("  baseline's error alone (tuned side exact):", summary(r["err_base_only"]))
    print("  tuned side's error alone (baseline exact):", summary(r["err_tuned_only"]))
    print("  baseline's power alone (its s/step exact):", summary(r["err_base_P_only"]))
    print("  baseline's time alone (its W exact):", summary(r["err_base_t_only"]))
    for k in ("base_J", "base_t", "base_P", "tuned_J", "tuned_t", "tuned_P"):
        print(f"  {k:8s} rel error: {rel_summary(r[k])}")
    base_rms = 100 * math.sqrt(statistics.mean(x * x for x in r['base_rel_stated']))
    tuned_rms = 100 * math.sqrt(statistics.mean(x * x for x in r['tuned_rel_stated']))
    print(f"  stated rel s.d.: baseline rms {base_rms:.2f}%, tuned rms {tuned_rms:.2f}%; steps median baseline "
          f"{statistics.median(r['base_steps']):.0f}, tuned {statistics.median(r['tuned_steps']):.0f}")
    # the worst jobs
    order = sorted(range(len(r["err"])), key=lambda k: -abs(r["err"][k]))[:6]
    js = [j for j in jobs if j["saving"] is not None]
    for k in order:
        j = js[k]
        print(f"    worst: {j['name']} seed {j['seed']}: err {100 * r['err'][k]:+.2f} (sd {100 * r['sd'][k]:.2f}), "
              f"base_J {100 * r['base_J'][k]:+.2f}% base_t {100 * r['base_t'][k]:+.2f}% "
              f"base_P {100 * r['base_P'][k]:+.2f}%, "
              f"tuned_J {100 * r['tuned_J'][k]:+.2f}%, base steps {r['base_steps'][k]}, parts {len(j['parts'])}, "
              f"top step {j['t'][-1]:.3f} s")
    return r


# ---- estimators -------------------------------------------------------------------------------------------------

STEP_CV = 0.15  # the steps' scatter a measurement's time is taken to carry when nothing better is known


def _wls(points):
    """Weighted least squares of t = a + b / f over points (f, t, sd): (a, b, cov, chi2, dof)."""
    s11 = s12 = s22 = r1 = r2 = 0.0
    for f, t, sd in points:
        w = 1.0 / (sd * sd)
        x1, x2 = 1.0, 1.0 / f
        s11 += w * x1 * x1
        s12 += w * x1 * x2
        s22 += w * x2 * x2
        r1 += w * x1 * t
        r2 += w * x2 * t
    det = s11 * s22 - s12 * s12
    if det <= 0:
        return None
    a = (r1 * s22 - r2 * s12) / det
    b = (s11 * r2 - s12 * r1) / det
    cov = ((s22 / det, -s12 / det), (-s12 / det, s11 / det))
    chi2 = sum(((a + b / f - t) / sd) ** 2 for f, t, sd in points)
    return a, b, cov, chi2, len(points) - 2


def est_model(job, levels_from=0.0, include_base=True):
    """(a): the top level's J/step as the baseline's power times a step time from t = a + b/f fitted to every
    measurement of the job's step time (the baseline's parts, the search's windows, the steps at the pick), each
    weighed by its uncertainty (STEP_CV / sqrt(steps)); the fit's s.d. inflated by its reduced chi2 where above 1.
    ``levels_from``: only levels at or above that fraction of the top clock."""
    sv = job["saving"]
    f_top = job["levels"][-1]
    nb, sb, Pb = baseline_side(job)
    Jt = sv["tuned_j_per_step"]
    pts = []
    if include_base:
        pts.append((f_top / 1e9, sb, sb * STEP_CV / math.sqrt(nb)))
    for m in job["windows"]:
        if m["level"] is not None and m["level"] >= levels_from * f_top and m["n"] > 0:
            pts.append((m["level"] / 1e9, m["s"], m["s"] * STEP_CV / math.sqrt(m["n"])))
    _, st, nt = tuned_side(job)
    if job["best_hz"] >= levels_from * f_top:
        pts.append((job["best_hz"] / 1e9, st, st * STEP_CV / math.sqrt(nt)))
    if len({p[0] for p in pts}) < 3:
        return None
    fit = _wls(pts)
    if fit is None:
        return None
    a, b, cov, chi2, dof = fit
    x = (1.0, 1e9 / f_top)
    t_top = a + b * x[1]
    var = cov[0][0] + 2 * cov[0][1] * x[1] + cov[1][1] * x[1] ** 2
    var *= max(1.0, chi2 / max(1, dof))
    rel = math.sqrt(var) / t_top
    J_top = Pb * t_top
    ratio = Jt / J_top
    return 1 - ratio, ratio * math.hypot(rel, sv["tuned_rel"])


def est_model_re(job):
    """(a'), honest about the model: t = a + b/f plus a bump of each level off it (s.d. tau, relative, estimated from
    the fit's residuals beyond their own noise, Paule-Mandel), fitted to every level but the top; its prediction at the
    top (the fit's variance and tau^2) combined with the baseline's own step time by inverse variance (a BLUP)."""
    sv = job["saving"]
    f_top = job["levels"][-1]
    nb, sb, Pb = baseline_side(job)
    Jt = sv["tuned_j_per_step"]
    sd_b = max(sv["baseline_rel"], STEP_CV / math.sqrt(nb))  # relative
    by_level = defaultdict(lambda: [0.0, 0.0])
    for m in job["windows"]:
        if m["level"] is not None and m["level"] != f_top and m["n"] > 0:
            by_level[m["level"]][0] += m["s"] * m["n"]
            by_level[m["level"]][1] += m["n"]
    _, st, nt = tuned_side(job)
    if job["best_hz"] != f_top:
        by_level[job["best_hz"]][0] += st * nt
        by_level[job["best_hz"]][1] += nt
    pts0 = [(f / 1e9, t / n, STEP_CV / math.sqrt(n)) for f, (t, n) in by_level.items()]  # relative sd
    if len(pts0) < 3:
        return None
    def fit(tau):
        return _wls([(f, t, t * math.hypot(r, tau)) for f, t, r in pts0])
    lo, hi = 0.0, 0.5
    f0 = fit(0.0)
    if f0 is None:
        return None
    if f0[3] > f0[4]:
        for _ in range(40):
            mid = (lo + hi) / 2
            r = fit(mid)
            lo, hi = (mid, hi) if r[3] > r[4] else (lo, mid)
        tau = hi
    else:
        tau = 0.0
    a, b, cov, _, _ = fit(tau)
    x = 1e9 / f_top
    t_m = a + b * x
    if t_m <= 0:
        return None
    var_m = (cov[0][0] + 2 * cov[0][1] * x + cov[1][1] * x * x) / t_m ** 2 + tau * tau
    w_b, w_m = 1 / sd_b ** 2, 1 / var_m
    log_t = (w_b * math.log(sb) + w_m * math.log(t_m)) / (w_b + w_m)
    rel = math.sqrt(1 / (w_b + w_m))
    ratio = Jt / (Pb * math.exp(log_t))
    return 1 - ratio, ratio * math.hypot(rel, sv["tuned_rel"])


def est_top_windows(job):
    """(b1): the search's own windows at the top level (pinned there) pooled with the baseline's parts, each part and
    window weighing by its steps (the assumption: the default governor runs a busy GPU at the top level)."""
    sv = job["saving"]
    f_top = job["levels"][-1]
    tops = [m for m in job["windows"] if m["level"] == f_top]
    if not tops:
        return None
    J, rel = pooled_j(pooled_parts(job) + tops)
    ratio = sv["tuned_j_per_step"] / J
    return 1 - ratio, ratio * math.hypot(rel, sv["tuned_rel"])


def _pick_series(job):
    """The stretches at the pick as lists of cumulative points (steps, joules)."""
    best = job["best_hz"]
    out = []
    for s in job["stretches"]:
        if s["level"] != best:
            continue
        pts = [tuple(s["first"])] + [tuple(p) for p in s["marks"]]
        if tuple(s["last"]) != pts[-1]:
            pts.append(tuple(s["last"]))
        if len(pts) >= 2:
            out.append(pts)
    return out


def _span(pts, a, b):
    """Joules and steps of a stretch's points between steps a and b (nearest points inside)."""
    inside = [p for p in pts if a <= p[0] <= b]
    if len(inside) < 2:
        return None
    return inside[-1][1] - inside[0][1], inside[-1][0] - inside[0][0]


def est_drift_cv(job, flank_mult=1.0, beta_fixed=None):
    """(b2): each later part's J/step corrected for the drift of its moment, as the steps at the pick around it show
    it: the part reads y = J_part / J_top - 1, the pick's flanks (flank_mult x the part's steps on each side) read x =
    J_flanks / J_pick - 1, and the part is taken as J_part / (1 + beta x), beta the regression of a block's deviation
    on its flanks' over the pick's own stretches (0 where the steps do not drift: then nothing changes). Assumes the
    drift is one factor shared by every level."""
    sv = job["saving"]
    series = _pick_series(job)
    Jt = sv["tuned_j_per_step"]
    parts = pooled_parts(job)
    if len(parts) < 2 or not series:
        return None
    n_part = statistics.median(p["n"] for p in parts)
    L = flank_mult * n_part
    # beta from the pick's own stretches: blocks of n_part with flanks of L each side
    xs, ys = [], []
    for pts in series:
        lo, hi = pts[0][0], pts[-1][0]
        c = lo + L
        while c + n_part + L <= hi:
            mid = _span(pts, c, c + n_part)
            left = _span(pts, c - L, c)
            right = _span(pts, c + n_part, c + n_part + L)
            if mid and left and right and mid[1] > 0:
                ys.append(mid[0] / mid[1] / Jt - 1)
                xs.append((left[0] + right[0]) / (left[1] + right[1]) / Jt - 1)
            c += n_part
    if len(xs) < 8:
        return None
    beta = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    beta = min(1.0, max(0.0, beta)) if beta_fixed is None else beta_fixed
    # each part's flanks: the stretches at the pick just before and just after its middle
    adjusted = []
    for p in parts:
        c0, c1 = p["at"] - p["n"] / 2, p["at"] + p["n"] / 2
        J = n = 0.0
        for pts in series:
            for a, b in ((c0 - L - 3 * n_part, c0), (c1, c1 + L + 3 * n_part)):  # settling: allow a gap
                if pts[-1][0] <= a or pts[0][0] >= b:
                    continue
                # the L steps of this stretch closest to the part
                if b == c0:
                    seg = _span(pts, max(pts[0][0], min(b, pts[-1][0]) - L), min(b, pts[-1][0]))
                else:
                    start = max(a, pts[0][0])
                    seg = _span(pts, start, min(pts[-1][0], start + L))
                if seg and seg[1] > 0:
                    J += seg[0]
                    n += seg[1]
        x = J / n / Jt - 1 if n >= n_part / 2 else 0.0
        adjusted.append({**p, "j": p["j"] / (1 + beta * x)})
    Jb, rel = pooled_j(adjusted)
    ratio = Jt / Jb
    return 1 - ratio, ratio * math.hypot(rel, sv["tuned_rel"])


def evaluate(jobs, name, fn):
    errs, sds, none = [], [], 0
    for job in jobs:
        if job["saving"] is None:
            continue
        out = fn(job)
        if out is None:
            out = (job["saving"]["saved_rel"], job["saving"]["saved_pct_err"] / 100)
            none += 1
        errs.append(out[0] - job["true"])
        sds.append(out[1])
    print(f"  {name:50s} {summary(errs, sds)}  [{len(errs)} jobs, {none} fell back]")


ESTIMATORS = {
    "as reported": lambda j: (j["saving"]["saved_rel"], j["saving"]["saved_pct_err"] / 100),
    "(a) t = a + b/f, every level": lambda j: est_model(j),
    "(a) t = a + b/f, levels >= 0.5 top": lambda j: est_model(j, 0.5),
    "(a) t = a + b/f, levels >= 0.75 top": lambda j: est_model(j, 0.75),
    "(a') a + b/f + level bumps (tau), BLUP with the baseline": est_model_re,
    "(b1) + the search's windows at the top": est_top_windows,
    "(b2) parts corrected by the pick's flanks (drift)": est_drift_cv,
    "(b2) flanks 3x": lambda j: est_drift_cv(j, 3.0),
    "(b2) flanks 1x, beta 1 (a paired ratio)": lambda j: est_drift_cv(j, 1.0, 1.0),
    "(b2) flanks 2x, beta 1 (a paired ratio)": lambda j: est_drift_cv(j, 2.0, 1.0),
}


def run_estimators(jobs):
    for meter in sorted({j["meter"] for j in jobs}):
        print(f"\n== estimators, {meter} ==")
        sub = [j for j in jobs if j["meter"] == meter]
        for name, fn in ESTIMATORS.items():
            evaluate(sub, name, fn)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", help="saving_dump's output (JSON lines)")
    p.add_argument("--no-decompose", action="store_true", help="only the estimators, not the error's parts")
    args = p.parse_args(argv)
    jobs = load(args.dump)
    if not args.no_decompose:
        for meter in sorted({j["meter"] for j in jobs}):
            report_decomposition([j for j in jobs if j["meter"] == meter], meter)
    run_estimators(jobs)


if __name__ == "__main__":
    main()
