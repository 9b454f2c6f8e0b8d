"""The terminal tables of ``servesim run``: the headline, the latency summary, the
replicas of a cluster, and the one-line texts they share (saturation, prefix cache,
scale-out). Rendering only: the numbers are summary.json's."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _fmt(x: Any, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None else f"{x * scale:,.{digits}f}"


def summary_table(summary: dict[str, Any], title: str = "summary") -> Table:
    """A rich table of the headline metrics of one summary.json."""
    if summary.get("saturated"):
        title += " (SATURATED: not steady-state)"
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="right")
    for key, label in (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"), ("itl_s", "ITL (ms)"),
                       ("e2e_latency_s", "E2E latency (s)"), ("queued_time_s", "queued (s)")):
        st = summary[key]
        scale = 1000.0 if "ms" in label else 1.0
        t.add_row(label, *(_fmt(st[c], scale, 1 if scale > 1 else 3)
                           for c in ("mean", "p50", "p90", "p99", "max")))
    return t


def _seconds(t: float) -> str:
    """A time for a one-line account: one decimal below 1,000 s, none above."""
    return f"{t:,.1f}" if abs(t) < 1000 else f"{t:,.0f}"


def saturation_text(summary: dict[str, Any]) -> str:
    """One line for tables: whether the run saturated and what the rule saw, from
    summary.json's ``saturation`` (see sim/saturation.py): the backlog's growth and
    window, then when it drained or how many still waited when arrivals ended (or, for
    a run flagged by its requests in the system alone, their growth over the second half
    of arrivals); for a steady run the largest backlog and why it did not count."""
    sat = summary.get("saturation") or {}
    if "backlog_growth" not in sat:  # not measured (too few requests, one instant)
        if summary.get("saturated"):
            return "[bold red]SATURATED[/bold red]: latency percentiles are not steady-state"
        return f"no (not measured: {sat['reason']})" if "reason" in sat else "no"
    grew, (start, end) = sat["backlog_growth"], sat["growth_window_s"]
    if not summary.get("saturated"):
        return (f"no (steady state: largest backlog {grew:,} at {_seconds(end)} s, "
                f"{sat['reason']})")
    if sat["reason"] is not None:  # saturated by the requests in the system alone
        pile = sat["in_system"]
        mid, last = pile["window_s"]
        return (f"[bold red]SATURATED[/bold red]: requests in the system grew by "
                f"{pile['growth']:,.0f} from {_seconds(mid)} s to {_seconds(last)} s, still "
                f"growing when arrivals ended")
    text = (f"[bold red]SATURATED[/bold red]: backlog grew by {grew:,} requests from "
            f"{_seconds(start)} s to {_seconds(end)} s")
    drained, arrivals_end = sat["drained_s"], sat["arrival_window_s"][1]
    if drained is not None and drained <= arrivals_end:
        return f"{text}, drained by {_seconds(drained)} s"
    return (f"{text}; {sat['backlog_at_end_of_arrivals']:,} still waiting when arrivals "
            f"ended at {_seconds(arrivals_end)} s")


def scale_out_line(cfg: Any) -> str:
    """GPUs, replicas and the load model of a run, in one line."""
    tp, n = cfg.tensor_parallel_size, cfg.replicas
    load = (f"closed loop, {cfg.concurrency} users, think time {cfg.think_time:g} s"
            if cfg.concurrency is not None else "open loop")
    route = f", router {cfg.router}" if n > 1 else ""
    return (f"GPUs: {n * tp} ({n} replica{'s' if n > 1 else ''} x TP {tp}){route}; "
            f"KV cache and memory per GPU; {load}")


def replica_table(summary: dict[str, Any]) -> Table:
    """Per-replica headline metrics of a cluster run."""
    t = Table(title="replicas", header_style="bold")
    for c in ("replica", "requests", "req/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
              "TPOT p99 (ms)", "KV peak", "saturated"):
        t.add_column(c, justify="right")
    for r in summary["replicas"]:
        t.add_row(str(r["replica"]), f"{r['num_requests']:,}",
                  f"{r['throughput']['requests_per_s']:.3f}", _fmt(r["ttft_s"]["p50"], 1e3, 1),
                  _fmt(r["ttft_s"]["p99"], 1e3, 1), _fmt(r["tpot_s"]["p99"], 1e3, 1),
                  f"{r['kv_cache']['peak_usage']:.1%}", "YES" if r["saturated"] else "no")
    return t


def prefix_cache_text(pc: dict[str, Any]) -> str:
    """One line for tables: hit rate, prefill tokens saved and evictions of a run's
    prefix cache (summary.json's ``prefix_cache``)."""
    hit = pc["hit_rate_tokens"]
    rate = "-" if hit is None else f"{hit:.1%}"
    return (f"{pc['mode']}: hit rate {rate} of prompt tokens, "
            f"{pc['prefill_tokens_saved']:,} prefill tokens saved, "
            f"{pc['evictions']:,} blocks evicted")


def headline_table(summary: dict[str, Any]) -> Table:
    t = Table(show_header=False, box=None)
    thr, kv, sl = summary["throughput"], summary["kv_cache"], summary["slots"]
    good = summary["goodput_requests_per_s"]
    rows = [
        ("requests", f"{summary['num_finished']:,} finished, {summary['num_rejected']:,} "
                     f"rejected of {summary['num_requests']:,}"),
        ("duration", f"{summary['duration_s']:,.2f} s"),
        ("throughput", f"{thr['requests_per_s']:,.3f} req/s, "
                       f"{thr['output_tokens_per_s']:,.1f} output tok/s, "
                       f"{thr['total_tokens_per_s']:,.1f} total tok/s"),
        ("goodput", "-" if good is None else f"{good:,.3f} req/s"),
        ("preemptions", f"{summary['num_preemptions']:,}"
                        + (f" ({summary['num_swaps']:,} by swap)" if summary.get("num_swaps")
                           else "")),
        ("KV cache usage", f"peak {kv['peak_usage']:.1%}, mean {kv['mean_usage']:.1%}"),
        ("batch slots", f"useful {sl['useful_fraction']:.1%}, idle {sl['idle_fraction']:.1%}, "
                        f"empty {sl['empty_fraction']:.1%}; mean batch "
                        f"{summary['batch']['mean_num_seqs']:.1f} seqs"),
        ("saturated", saturation_text(summary)),
    ]
    pc = summary.get("prefix_cache")
    if pc and pc.get("mode", "none") != "none":
        rows.insert(5, ("prefix cache", prefix_cache_text(pc)))
    for k, v in rows:
        t.add_row(f"[bold]{k}[/bold]", v)
    return t
