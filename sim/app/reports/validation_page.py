"""validation.html: the page of one ``servesim validate`` run, drawn from its
validation.json dict (sim/app/runs/validate.py), so the page can be redrawn from the file alone;
and the run's outputs (``write_validation``: that page, validation.json and the two run
directories, whole or not at all). A run against a vllm bench result (``--against``) has its
own page (``against_page``: the error table without and with the frontend term, no step
figures) and outputs (``write_against``: no measured/ run directory, the real server ran
no servesim engine); a run against the vLLM engine (``--engine vllm``) has this page with
vLLM's steps and requests, and ``write_vllm_validation``'s outputs (predicted/ only).

Owns the tables (error table, step error, setup) and four figures: predicted against
measured step times (same step, same shape), the per-step error over time, per-request TTFT
and E2E latency (simulated against real), and the CDFs of TTFT, TPOT and E2E latency of
both runs. plotly is imported inside the drawing functions; the page shell (plotly.js
inlined once) is sim.app.reports.html_page.page.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.app.reports.html_page import page, table
from sim.app.reports.report import COLOURS, cdf_points
from sim.app.runs.out_dir import check_files, check_run_dir, commit_dirs, discard, write_files
from sim.app.runs.run_files import stage_run
from sim.app.runs.runner import Prepared

if TYPE_CHECKING:
    from sim.app.runs.against import Against
    from sim.app.runs.validate import Validation
    from sim.app.runs.validate_vllm import AlsoPriced, VllmValidation
    from sim.simulate import SimResult

PRED, MEAS = COLOURS[0], COLOURS[1]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _val(x: float | None) -> str:
    return "-" if x is None else f"{x:,.3f}"


def error_table_html(data: dict[str, Any], key: str = "errors",
                     measured: str = "measured (real run)") -> str:
    rows = [[r["metric"], _val(r["predicted"]), _val(r["measured"]), _pct(r["error"])]
            for r in data[key]]
    return table(["metric", "predicted (simulation)", measured,
                   "error (pred / meas - 1)"], rows, table_id=key.replace("_", "-"))


def step_error_html(data: dict[str, Any]) -> str:
    e = data["step_error"]
    if not e.get("num_steps"):
        return "<p>no steps</p>"
    rows = [["steps", f"{e['num_steps']:,}"], ["MAPE", f"{e['mape']:.1%}"],
            ["bias (mean signed error)", _pct(e["bias"])],
            ["|error| p50", f"{e['p50_abs']:.1%}"], ["|error| p90", f"{e['p90_abs']:.1%}"],
            ["|error| p99", f"{e['p99_abs']:.1%}"], ["|error| max", f"{e['max_abs']:.1%}"],
            ["busy time (sum of steps)", _pct(e["busy_time_error"])]]
    probe = data.get("device_probe")
    if probe:
        rows += [["device drift since calibration (probe p50)", _pct(probe["drift_p50"])],
                 ["device drift, slowest probe", _pct(probe["drift_min"])],
                 ["bias with the drift taken out", _pct(probe["step_bias_vs_probe"])]]
    return table(["per-step time error", "value"], rows, table_id="step-error")


def setup_html(data: dict[str, Any]) -> str:
    r, cfg = data["real"], data["config"]
    sched = ("yes" if data["same_schedule"] else
             f"no: first difference at step {data['first_different_step']}")
    rows = [["workload", str(cfg["resolved"]["workload"])],
            ["requests", f"{cfg['resolved']['num_requests']:,}"],
            ["policy", str(cfg["policy"])],
            ["max_num_seqs / max_num_batched_tokens",
             f"{cfg['max_num_seqs']} / {cfg['max_num_batched_tokens']}"],
            ["prediction", str(cfg["resolved"]["cost_model"])],
            ["real run", _real_run(r)],
            ["same schedule in both runs", sched],
            ["same admission order", "yes" if data["same_admission_order"] else "no"],
            ["wall time (prediction / real run)",
             f"{data['wall_s']['predicted']:.1f} s / {data['wall_s']['measured']:.1f} s"]]
    return table(["setting", "value"], rows, table_id="setup")


def _real_run(r: dict[str, Any]) -> str:
    where = f"{r['model']} ({r['dtype']}) on {r['device']}, {r['threads'] or 'default'} threads"
    if r.get("engine") in ("vllm", "fake"):
        return (f"{r['engine']} engine {r.get('vllm_version') or ''} serving the workload with "
                f"its own scheduler: {where}, {r['timer']} clock")
    pick = "median" if r.get("statistic") == "median" else "fastest"
    return f"{where}, {r['timer']} clock, each step the {pick} of {r['repeats']} run(s)"


def _arr(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _kind(steps: dict[str, list[Any]]) -> np.ndarray:
    pre = np.asarray(steps["num_prefill_tokens"]) > 0
    dec = np.asarray(steps["num_decode_tokens"]) > 0
    return np.where(pre & dec, "mixed", np.where(pre, "prefill", "decode"))


def step_figure(data: dict[str, Any]) -> Any:
    """Predicted against measured time of every real step (left, log axes, y = x
    dashed) and the per-step relative error over simulated time (right)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    st = data["steps"]
    pred, meas = _arr(st["predicted_s"]), _arr(st["measured_s"])
    t = _arr(st["start_time"])
    kind = _kind(st)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=[
        "step time: predicted vs measured (s)", "per-step error (pred / meas - 1)"])
    for k, colour in zip(("decode", "prefill", "mixed"), COLOURS[2:5], strict=True):
        sel = kind == k
        if not sel.any():
            continue
        text = [f"{n} seqs" for n in np.asarray(st["num_seqs"])[sel]]
        fig.add_trace(go.Scatter(
            x=meas[sel], y=pred[sel], mode="markers", name=k, legendgroup=k, text=text,
            marker={"color": colour, "size": 4, "opacity": 0.6},
            hovertemplate="measured %{x:.4f} s<br>predicted %{y:.4f} s<br>%{text}"
                          f"<extra>{k}</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=t[sel], y=pred[sel] / meas[sel] - 1, mode="markers", name=k, legendgroup=k,
            showlegend=False, marker={"color": colour, "size": 4, "opacity": 0.6},
            hovertemplate="t %{x:.2f} s<br>error %{y:+.1%}" f"<extra>{k}</extra>"),
            row=1, col=2)
    _probe_trace(fig, data.get("device_probe"), t, _arr(st["measured_s"]))
    finite = np.concatenate([pred[np.isfinite(pred)], meas[np.isfinite(meas)]])
    if finite.size:
        lo, hi = float(finite.min()) * 0.9, float(finite.max()) * 1.1
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", showlegend=False,
                                 line={"color": "#888", "dash": "dash"}, hoverinfo="skip"),
                      row=1, col=1)
    fig.update_xaxes(type="log", title_text="measured (s)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="predicted (s)", row=1, col=1)
    fig.update_xaxes(title_text="step start, real run (s)", row=1, col=2)
    fig.update_yaxes(tickformat="+.0%", row=1, col=2)
    fig.update_layout(height=480, title="Step times: the same steps, priced and executed")
    return fig


def request_figure(data: dict[str, Any]) -> Any:
    """Per-request TTFT and E2E latency: simulated (y) against real (x), y = x dashed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rq = data["requests"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["TTFT (s)", "E2E latency (s)"])
    for c, col in enumerate(("ttft_s", "e2e_latency_s"), start=1):
        x, y = _arr(rq[f"measured_{col}"]), _arr(rq[f"predicted_{col}"])
        ok = np.isfinite(x) & np.isfinite(y)
        fig.add_trace(go.Scatter(
            x=x[ok], y=y[ok], mode="markers", showlegend=False,
            text=np.asarray(rq["request_id"])[ok], marker={"color": PRED, "size": 5},
            hovertemplate="request %{text}<br>real %{x:.3f} s<br>simulated %{y:.3f} s"
                          "<extra></extra>"), row=1, col=c)
        if ok.any():
            hi = float(max(x[ok].max(), y[ok].max())) * 1.05
            fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", showlegend=False,
                                     line={"color": "#888", "dash": "dash"},
                                     hoverinfo="skip"), row=1, col=c)
        fig.update_xaxes(title_text="measured (real run)", row=1, col=c)
        fig.update_yaxes(title_text="predicted (simulation)", row=1, col=c)
    fig.update_layout(height=450, title="Per request: simulation against real run")
    return fig


def cdf_figure(data: dict[str, Any]) -> Any:
    """Empirical CDFs of TTFT, TPOT and E2E latency, prediction and real run overlaid."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rq = data["requests"]
    cols = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_latency_s", "E2E (s)"))
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=[t for _, t in cols])
    for j, (col, label) in enumerate(cols, start=1):
        for run, colour in (("predicted", PRED), ("measured", MEAS)):
            x, y = cdf_points(_arr(rq[f"{run}_{col}"]))
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", line={"color": colour, "shape": "hv"}, name=run,
                legendgroup=run, showlegend=j == 1,
                hovertemplate=f"{label} %{{x:.4g}}<br>fraction %{{y:.3f}}<extra>{run}</extra>"),
                row=1, col=j)
    fig.update_yaxes(range=[0, 1.01], title_text="fraction of requests", col=1)
    fig.update_layout(height=420, title="Latency distributions (empirical CDFs)")
    return fig


def _probe_trace(fig: Any, probe: dict[str, Any] | None, start: np.ndarray,
                 measured: np.ndarray) -> None:
    """The device probe's drift (reference / probe - 1, calibration.device_probe) on the
    per-step error panel, at the instant each probe ran: the start of the step it came
    before, or the end of the last step for the final one."""
    if not probe or not start.size:
        return
    import plotly.graph_objects as go

    ref = probe["calibrated_s"] if probe.get("calibrated_s") is not None \
        else probe["predicted_s"]
    end = float(start[-1] + measured[-1])
    at = [float(start[i]) if i < start.size else end for i in probe["before_step"]]
    drift = [ref / m - 1 for m in probe["measured_s"]]
    fig.add_trace(go.Scatter(
        x=at, y=drift, mode="lines+markers", name="device probe (drift)",
        line={"color": "#222", "width": 1}, marker={"size": 6, "symbol": "diamond"},
        hovertemplate="t %{x:.2f} s<br>drift %{y:+.1%}<extra>device probe</extra>"),
        row=1, col=2)


def validation_page(data: dict[str, Any]) -> str:
    """The whole page, self-contained (works offline)."""
    note = ("<p class=\"note\">error = predicted / measured - 1: positive when the "
            "simulation says more than the real run measured. Step errors compare the "
            "profile's price of each executed step with its measured time (same shape).</p>")
    parts: list[Any] = [
        '<div class="row"><div><h2>Error table</h2>', error_table_html(data), note,
        "</div><div><h2>Step time error</h2>", step_error_html(data),
        "<h2>Setup</h2>", setup_html(data), "</div></div>",
        "<h2>Step times</h2>", step_figure(data),
        "<h2>Per request</h2>", request_figure(data),
        "<h2>Latency CDFs</h2>", cdf_figure(data),
    ]
    return page(f"servesim validate: {data['config']['policy']}", parts)


def against_setup_html(data: dict[str, Any]) -> str:
    """The setup of a run against a vllm bench result (sim/app/runs/against.py)."""
    a, cfg = data["against"], data["config"]
    meta = a["vllm"]
    f = data["frontend"]
    term = "none" if f is None else (
        f"{f['ttft_s'] * 1e3:.1f} ms before the first token, {f['token_s'] * 1e3:.3f} ms per "
        f"output token ({'fitted: ' + ', '.join(f['fitted']) if f['fitted'] else 'given'})")
    rows = [["result", str(a["file"])],
            ["server", ", ".join(f"{k} {meta[k]}" for k in ("backend", "model_id", "date")
                                 if meta.get(k) is not None) or "-"],
            ["requests replayed / failed (left out)",
             f"{a['num_replayed']:,} / {a['num_failed']:,}"],
            ["policy", str(cfg["policy"])],
            ["max_num_seqs / max_num_batched_tokens",
             f"{cfg['max_num_seqs']} / {cfg['max_num_batched_tokens']}"],
            ["prediction", str(cfg["resolved"]["cost_model"])],
            ["frontend term", term],
            ["wall time (simulation)", f"{data['wall_s']['predicted']:.1f} s"]]
    return table(["setting", "value"], rows, table_id="setup")


def against_page(data: dict[str, Any]) -> str:
    """The page of a run against a vllm bench result: the error table without and with
    the frontend term, the setup, the per-request and CDF figures (no step figures: a
    client sees no steps)."""
    meas = "measured (vllm bench, client side)"
    note = ("<p class=\"note\">error = predicted / measured - 1: positive when the "
            "simulation says more than the server's clients measured. The frontend term "
            "adds the API server's time to the simulated client-side times "
            "(docs/fidelity.md).</p>")
    parts: list[Any] = ['<div class="row"><div><h2>Error table: engine only</h2>',
                        error_table_html(data, "errors", meas), note]
    if data["errors_with_frontend"] is not None:
        parts += ["<h2>Error table: with the frontend term</h2>",
                  error_table_html(data, "errors_with_frontend", meas)]
    parts += ["</div><div><h2>Setup</h2>", against_setup_html(data), "</div></div>",
              "<h2>Per request</h2>", request_figure(data),
              "<h2>Latency CDFs</h2>", cdf_figure(data)]
    return page(f"servesim validate --against: {Path(data['against']['file']).name}", parts)


# -- the run's outputs ---------------------------------------------------------------


def write_validation(out_dir: Path, prep: Prepared, v: Validation) -> dict[str, Any]:
    """Write validation.json, validation.html and the two run directories (predicted/,
    measured/: `servesim report` reads them) into ``out_dir``, whole or not at all as
    far as sim/app/runs/out_dir.py can make it (both runs staged, then swapped in, then the two
    files renamed into place); returns the JSON dict. Raises ValueError (naming out) when
    a run directory there may not be replaced or a file's place is a directory."""
    out_dir = check_files(out_dir, VALIDATION_FILES)
    check_validation_out(out_dir)
    from sim.app.runs.validate import validation_dict

    data = validation_dict(prep, v)
    label = (f"measured: {v.setup.spec.name} on {v.setup.device} ({v.setup.dtype}, "
             f"{v.setup.threads or 'default'} threads, {v.timer} clock, fastest of "
             f"{v.setup.repeats})")
    staged: list[tuple[Path, Path]] = []
    try:
        staged.append((stage_run(out_dir / "predicted", prep, v.predicted, full_steps=True),
                       out_dir / "predicted"))
        staged.append((stage_run(out_dir / "measured",
                                 dataclasses.replace(prep, cost_model_label=label),
                                 v.measured, full_steps=True), out_dir / "measured"))
        page_html = validation_page(data)
    except BaseException:
        discard(staged)
        raise
    commit_dirs(staged)
    write_files(out_dir, {"validation.json": lambda: json.dumps(data, indent=1) + "\n",
                          "validation.html": lambda: page_html})
    return data


def write_vllm_validation(out_dir: Path, prep: Prepared, v: VllmValidation,
                          also: AlsoPriced | None = None) -> dict[str, Any]:
    """Write validation.json, validation.html and predicted/ of a run against the vLLM
    engine into ``out_dir``, as write_against does (vLLM's own run has no servesim run
    directory: its steps and requests are in validation.json). Returns the JSON dict.
    Raises ValueError as check_validation_out."""
    out_dir = check_files(out_dir, VALIDATION_FILES)
    check_validation_out(out_dir)
    from sim.app.runs.vllm_comparison import vllm_validation_dict

    data = vllm_validation_dict(prep, v, also)
    return _write_predicted_only(out_dir, prep, v.predicted, data, validation_page)


VALIDATION_FILES = ("validation.json", "validation.html")


def check_validation_out(out_dir: Path) -> None:
    """Raise ValueError (naming out) when validate could not write ``out_dir`` whole: a
    file there, a directory where one of its files goes, or predicted/ or measured/
    that is not a previous run directory. Checked before measuring, and again before
    writing."""
    check_files(out_dir, VALIDATION_FILES)
    for sub in ("predicted", "measured"):
        check_run_dir(Path(out_dir) / sub)


def write_against(out_dir: Path, prep: Prepared, a: Against) -> dict[str, Any]:
    """Write validation.json, validation.html and predicted/ (the simulation's run
    directory) of a run against a result into ``out_dir``, as write_validation does; a
    measured/ run directory left there by a real-run validate is removed (it would
    describe another run). Returns the JSON dict. Raises ValueError as
    check_validation_out."""
    out_dir = check_files(out_dir, VALIDATION_FILES)
    check_validation_out(out_dir)
    from sim.app.runs.against import against_dict

    data = against_dict(prep, a)
    return _write_predicted_only(out_dir, prep, a.predicted, data, against_page)


def _write_predicted_only(out_dir: Path, prep: Prepared, predicted: SimResult,
                          data: dict[str, Any],
                          render: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """predicted/ staged and swapped in, a measured/ left by a torch-engine validate
    removed (it would describe another run), then validation.json and the page."""
    staged = [(stage_run(out_dir / "predicted", prep, predicted, full_steps=True),
               out_dir / "predicted")]
    try:
        page_html = render(data)
    except BaseException:
        discard(staged)
        raise
    commit_dirs(staged)
    if (out_dir / "measured").is_dir():
        shutil.rmtree(out_dir / "measured")
    write_files(out_dir, {"validation.json": lambda: json.dumps(data, indent=1) + "\n",
                          "validation.html": lambda: page_html})
    return data
