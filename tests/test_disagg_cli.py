"""``servesim run --disagg xPyD`` (sim/app/runs/disagg.py, sim/app/runs/pools.py): the
run's files gain the TTFT split and the ``disagg`` block, the run table shows the pools
and the link, the link's figures come from its preset or the numbers given, and bad
input is one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.pools import link_spec, parse_disagg
from sim.app.runs.run_config import RunConfig
from sim.disagg.link_spec import KV_LINKS

runner = CliRunner()

#: llama-3.1-8b's KV bytes a token in bf16: 32 layers x 8 KV heads x 128 x (K, V) x 2 B.
LLAMA_8B_KV_BYTES = 32 * 8 * 128 * 2 * 2


def test_run_writes_the_split_and_the_disagg_block(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--disagg", "2P1D", "--num-requests", "40", "--rate",
                              "2", "--step-time", "0.01", "--kv-link-gbps", "8",
                              "--kv-link-latency-us", "0", "--disagg-min-prompt-tokens",
                              "600", "--decode-max-num-seqs", "64", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "disaggregation (2P1D)" in res.output and "link custom (8 Gb/s" in res.output
    req = pd.read_csv(out / "requests.csv")
    remote = req["prefill_replica"].notna()
    assert (req.loc[~remote, "num_prompt_tokens"] < 600).all()
    assert (req.loc[remote, "num_prompt_tokens"] >= 600).all() and remote.any()
    split = req.loc[remote, ["prefill_queued_time_s", "prefill_time_s", "kv_wait_time_s",
                             "kv_transfer_time_s", "decode_admission_time_s"]].sum(axis=1)
    assert np.allclose(split, req.loc[remote, "ttft_s"], rtol=0, atol=1e-9)
    # Each prefill is one 10 ms step; the link moves 1e9 B/s, at least the prompt's bytes
    # alone on it.
    assert np.allclose(req.loc[remote, "prefill_time_s"], 0.01)
    alone = req.loc[remote, "num_prompt_tokens"] * LLAMA_8B_KV_BYTES / 1e9
    assert (req.loc[remote, "kv_transfer_time_s"] >= alone - 1e-12).all()
    summary = json.loads((out / "summary.json").read_text())
    d = summary["disagg"]
    assert d["link"]["bytes_moved"] == int(
        req.loc[remote, "num_prompt_tokens"].sum()) * LLAMA_8B_KV_BYTES
    assert d["num_local"] == int((~remote).sum())
    # A port per engine, each carrying its engine's prompts' bytes over 1e9 B/s x duration.
    ports = d["link"]["port_utilization"]
    sent = req.loc[remote].groupby("prefill_replica")["num_prompt_tokens"].sum()
    capacity = 1e9 * summary["duration_s"]
    assert ports["prefill"] == pytest.approx(
        [sent.get(p, 0) * LLAMA_8B_KV_BYTES / capacity for p in (0, 1)], rel=1e-12)
    assert ports["decode"] == pytest.approx([d["link"]["bytes_moved"] / capacity], rel=1e-12)
    assert d["link"]["utilization"] == pytest.approx(sum(ports["prefill"] + ports["decode"]) / 3)
    assert d["prefill"]["num_replicas"] == 2 and d["decode"]["num_replicas"] == 1
    # Every slot-step is useful, idle or empty, each pool's over its own max_num_seqs.
    assert sum(summary["slots"].values()) == pytest.approx(1.0, abs=1e-12)
    steps = pd.read_csv(out / "steps.csv")
    assert set(steps["pool"]) == {"prefill", "decode"}
    config = json.loads((out / "config.json").read_text())
    assert config["disagg"] == "2P1D" and config["decode_max_num_seqs"] == 64
    assert "prefill_max_num_seqs" not in config  # unset fields are left out


def test_aggregated_config_has_no_disagg_fields(tmp_path: Path) -> None:
    out = tmp_path / "agg"
    res = runner.invoke(app, ["run", "--num-requests", "5", "--step-time", "0.01",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert not [k for k in config if "disagg" in k or "kv_link" in k]
    assert "disaggregation" not in res.output


def test_link_presets_and_overrides() -> None:
    assert link_spec(RunConfig(disagg="1P1D")) == KV_LINKS["ib"]
    assert KV_LINKS["ib"].bandwidth_bytes_per_s == 50e9  # 400 Gb/s
    assert KV_LINKS["nvlink"].bandwidth_bytes_per_s == 450e9
    roce = link_spec(RunConfig(disagg="1P1D", kv_link="roce", kv_link_latency_us=3))
    assert (roce.name, roce.bandwidth_bytes_per_s, roce.latency_s) == ("roce", 25e9, 3e-6)
    custom = link_spec(RunConfig(disagg="1P1D", kv_link_gbps=100))
    assert (custom.bandwidth_bytes_per_s, custom.latency_s) == (12.5e9, 5e-6)
    assert parse_disagg("3p5d") == (3, 5)


@pytest.mark.parametrize(("args", "field"), [
    (["--disagg", "0P1D"], "disagg"),
    (["--disagg", "1P1"], "disagg"),
    (["--disagg", "1P1D", "--kv-link", "pcie"], "kv_link"),
    (["--disagg", "1P1D", "--kv-link-gbps", "0"], "kv_link_gbps"),
    (["--disagg", "1P1D", "--kv-link-latency-us", "-1"], "kv_link_latency_us"),
    (["--disagg", "1P1D", "--disagg-min-prompt-tokens", "-5"], "disagg_min_prompt_tokens"),
    (["--disagg", "1P1D", "--prefill-max-num-seqs", "0"], "prefill_max_num_seqs"),
    (["--disagg", "1P1D", "--replicas", "2"], "replicas"),
    (["--disagg", "1P1D", "--concurrency", "4"], "concurrency"),
    (["--disagg", "1P1D", "--prefix-cache", "block"], "prefix_cache"),
    (["--kv-link", "ib"], "kv_link"),
    (["--decode-max-num-seqs", "8"], "decode_max_num_seqs"),
])
def test_bad_input_is_one_line_naming_the_option(tmp_path: Path, args: list[str],
                                                 field: str) -> None:
    res = runner.invoke(app, ["run", "--num-requests", "5", "--step-time", "0.01",
                              "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 1 and field in res.output, res.output
    assert res.output.count("\n") == 1, res.output
