"""The run table of a disaggregated run (``servesim run --disagg``): each pool's GPU, TP
and KV blocks, utilization, batch and KV usage, the link's traffic and the mean TTFT
split, from summary.json's ``disagg`` block (rendering only)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def disagg_table(summary: dict[str, Any]) -> Table:
    """A rich table of summary.json's ``disagg`` block."""
    d = summary["disagg"]
    t = Table(title=f"disaggregation ({d['prefill']['num_replicas']}P"
                    f"{d['decode']['num_replicas']}D)", header_style="bold")
    for c in ("pool", "engines", "GPU", "TP", "KV blocks", "utilization", "mean batch",
              "KV peak", "KV mean"):
        t.add_column(c, justify="left" if c in ("pool", "GPU") else "right")
    for name in ("prefill", "decode"):
        p = d[name]
        t.add_row(name, str(p["num_replicas"]), str(p["gpu"]),
                  str(p["tensor_parallel_size"]), f"{p['num_gpu_blocks']:,}",
                  f"{p['utilization']:.1%}",
                  f"{p['batch']['mean_num_seqs']:.1f}", f"{p['kv_cache']['peak_usage']:.1%}",
                  f"{p['kv_cache']['mean_usage']:.1%}")
    link = d["link"]
    bw = link["bandwidth_bytes_per_s"]
    t.caption = (
        f"link {link['name']} ({'instant' if bw is None else f'{bw * 8 / 1e9:,.0f} Gb/s'} a port, "
        f"{link['latency_s'] * 1e6:g} us): {link['bytes_moved'] / 1e9:,.2f} GB in "
        f"{link['num_transfers']:,} transfers, mean port utilization "
        f"{link['utilization']:.1%}; "
        f"{d['num_local']:,} prompts kept local. Mean TTFT split (ms): "
        + ", ".join(f"{k.removesuffix('_time_s').replace('_', ' ')} "
                    f"{'-' if v is None else f'{v * 1e3:,.1f}'}"
                    for k, v in d["ttft_split_s"].items()))
    return t
