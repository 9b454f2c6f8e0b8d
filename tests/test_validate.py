"""sim.app.runs.validate and calibration.executor: the simulation and a real run on a tiny
random-weight decoder see the same schedule; the executor's caches follow the engine;
the device probe (calibration.device_probe) changes no run and its figures by hand; the
comparison figures; the `validate` command."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calibration.specs import ModelSpec
from sim.app.cli.main import app
from sim.app.runs.runner import RunConfig, prepare
from sim.app.runs.validate import (
    RealSetup,
    admission_order,
    cache_capacity,
    error_rows,
    first_difference,
    profile_threads,
    relative_error,
    step_error,
    validation_config,
)
from sim.batch import BatchPlan, BatchShape
from sim.request import Request

TINY = ModelSpec(
    name="tiny", hf_id="test/tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
    num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=100,
    max_position_embeddings=256, tie_word_embeddings=True, attention_bias=True)
TINY_REAL = RealSetup(TINY, "fp32", "cpu", 1, "thread")


def make_prep(**fields: Any) -> Any:
    """The teaching scenario (6 requests, all at t = 0: step times cannot reorder them),
    priced by a constant step time."""
    base: dict[str, Any] = dict(scenario="teaching", step_time=0.01, max_num_seqs=4,
                                max_num_batched_tokens=8, block_size=4)
    return prepare(RunConfig(**{**base, **fields}))


# -- both runs, for real ------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"policy": "chunked"},                        # chunked prefill, mixed steps
    {"policy": "static", "max_num_batched_tokens": None},  # padded prefill; no budget
    {"policy": "continuous", "max_num_batched_tokens": 16, "max_model_len": 16},
    {"policy": "chunked", "num_gpu_blocks": 3, "max_model_len": 8},  # preempt (recompute)
], ids=["chunked", "static", "continuous", "preempt"])
def test_real_run_sees_the_simulated_schedule(fields: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    from sim.app.runs.validate import run_validation, validation_dict

    prep = make_prep(**fields)
    v = run_validation(prep, TINY_REAL)
    pred, meas = v.schedules
    assert pred == meas and len(meas) > 3
    assert admission_order(v.predicted.requests) == admission_order(v.measured.requests)
    assert list(v.predicted.requests["status"]) == list(v.measured.requests["status"])
    assert (v.steps["measured_s"] > 0).all() and (v.steps["predicted_s"] == 0.01).all()
    assert len(v.steps) == len(meas)
    data = json.loads(json.dumps(validation_dict(prep, v)))  # serialisable, no NaN
    assert data["same_schedule"] and data["same_admission_order"]
    assert data["real"]["timer"] == "thread" and data["step_error"]["num_steps"] == len(meas)
    probe = data["device_probe"]  # the first step probes, and the run ends with one
    assert probe["before_step"][0] == 0 and probe["before_step"][-1] == len(meas)
    assert len(probe["measured_s"]) >= 2 and probe["predicted_s"] == 0.01
    assert probe["context_tokens"] == min(128, v.capacity - 1)
    if "num_gpu_blocks" in fields:
        assert v.measured.summary["num_preemptions"] > 0


# -- the executor's caches ----------------------------------------------------------------


def _req(i: int, prompt: int, out: int = 4) -> Request:
    return Request(f"r{i}", 0.0, prompt, out, out, index=i)


def _run(ex: Any, scheduled: list[tuple[Request, int]], holders: list[Request] | None = None,
         cost_shape: BatchShape | None = None) -> None:
    """Execute one plan, then apply the engine's update to the requests."""
    plan = BatchPlan(list(scheduled), [], holders, cost_shape)
    ex(plan, cost_shape or BatchShape())
    for r, n in scheduled:
        r.num_computed_tokens += n
        if r.num_computed_tokens >= r.num_tokens:
            r.num_output_tokens += 1


def test_executor_keeps_decodes_contiguous_and_caches_exact() -> None:
    pytest.importorskip("torch")
    from calibration.executor import TorchExecutor

    ex = TorchExecutor(TINY, capacity=32, max_num_seqs=3, dtype="fp32", warmup=False)
    a, b, c = _req(0, 5), _req(1, 7), _req(2, 3)
    _run(ex, [(a, 5), (b, 4)])                     # a's prompt; b's first chunk
    _run(ex, [(a, 1), (b, 3), (c, 3)])             # a decodes, b and c finish prompts
    assert ex._slot[a] == 0
    _run(ex, [(b, 1), (c, 1)], holders=[b, c])     # a left: b, c decode in slots 0..1
    assert sorted(ex._slot[r] for r in (b, c)) == [0, 1] and a not in ex._slot
    assert ex.cache.lengths[ex._slot[b]] == b.num_computed_tokens == 8
    assert ex.cache.lengths[ex._slot[c]] == c.num_computed_tokens == 4
    assert len(ex._tokens[b]) == b.num_prompt_tokens + b.num_output_tokens
    b.num_computed_tokens = 0                      # preempted (recompute), re-admitted
    _run(ex, [(b, 8), (c, 1)], holders=[b, c])
    assert ex.cache.lengths[ex._slot[b]] == 8 and ex._slot[c] == 0
    assert len(ex.timings) == 4 and all(t.seconds > 0 for t in ex.timings)
    ex.close()


def test_executor_sorts_decodes_by_context_and_groups_them() -> None:
    pytest.importorskip("torch")
    from calibration.executor import TorchExecutor, decode_groups

    assert decode_groups([300, 298, 250, 120, 118, 40], 128) == [3, 3]
    assert decode_groups([100] * 5, 128) == [5] and decode_groups([], 128) == []
    assert decode_groups([2000, 1900, 300, 290], 0) == [1, 1, 1, 1]
    ex = TorchExecutor(TINY, capacity=32, max_num_seqs=4, dtype="fp32", group_keys=0,
                       warmup=False)
    a, b, c, d = _req(0, 3), _req(1, 20), _req(2, 9), _req(3, 14)
    _run(ex, [(a, 3), (b, 8), (c, 9), (d, 8)])
    _run(ex, [(a, 1), (b, 8), (c, 1), (d, 6)])     # decodes a (ctx 3), c (ctx 9)
    assert [ex._slot[r] for r in (c, a)] == [0, 1]
    _run(ex, [(a, 1), (b, 4), (c, 1), (d, 1)])     # d joins the decodes between them
    assert [ex._slot[r] for r in (d, c, a)] == [0, 1, 2]
    for r in (a, b, c, d):
        assert ex.cache.lengths[ex._slot[r]] == r.num_computed_tokens
    _run(ex, [(a, 1), (b, 1), (c, 1), (d, 1)])     # all decode: b longest, then d, c, a
    assert [ex._slot[r] for r in (b, d, c, a)] == [0, 1, 2, 3]
    ex.close()


def test_executor_runs_static_cost_shape_and_refuses_other_shapes() -> None:
    pytest.importorskip("torch")
    from calibration.executor import TorchExecutor

    ex = TorchExecutor(TINY, capacity=32, max_num_seqs=2, dtype="fp32", warmup=False)
    a, b = _req(0, 3), _req(1, 6)
    pad = BatchShape(num_prefill_tokens=12, num_prefill_seqs=2, prefill_attention_pairs=42,
                     num_sampled_seqs=2)
    _run(ex, [(a, 3), (b, 6)], holders=[a, b], cost_shape=pad)
    assert [ex.cache.lengths[ex._slot[r]] for r in (a, b)] == [6, 6]  # padded prompts
    dec = BatchShape(num_decode_seqs=2, decode_context_tokens=14, num_sampled_seqs=2)
    _run(ex, [(b, 1)], holders=[a, b], cost_shape=dec)  # a finished: still computed
    assert [ex.cache.lengths[ex._slot[r]] for r in (a, b)] == [7, 7]
    wrong = BatchShape(num_decode_seqs=2, decode_context_tokens=99, num_sampled_seqs=2)
    with pytest.raises(ValueError, match="differs from the cost_shape"):
        ex(BatchPlan([(b, 1)], [], [a, b], wrong), wrong)
    with pytest.raises(ValueError, match="repeats"):
        TorchExecutor(TINY, capacity=8, max_num_seqs=1, repeats=0)
    with pytest.raises(ValueError, match="statistic"):
        TorchExecutor(TINY, capacity=8, max_num_seqs=1, statistic="mean")
    with pytest.raises(ValueError, match="timer 'thread'"):
        TorchExecutor(TINY, capacity=8, max_num_seqs=1, threads=2, timer="thread")
    ex.close()

def _probe_run(probe_every_s: float) -> Any:
    """Chunked prefills, decodes, a request leaving and a preemption (recompute)."""
    from calibration.executor import TorchExecutor

    ex = TorchExecutor(TINY, capacity=32, max_num_seqs=3, dtype="fp32", warmup=False,
                       probe_every_s=probe_every_s)
    a, b, c = _req(0, 5), _req(1, 7), _req(2, 3)
    _run(ex, [(a, 5), (b, 4)])
    _run(ex, [(a, 1), (b, 3), (c, 3)])
    _run(ex, [(b, 1), (c, 1)], holders=[b, c])
    b.num_computed_tokens = 0
    _run(ex, [(b, 8), (c, 1)], holders=[b, c])
    _run(ex, [(b, 1), (c, 1)], holders=[b, c])
    return ex, (a, b, c)


def test_probes_change_no_run() -> None:
    pytest.importorskip("torch")
    plain, reqs = _probe_run(0.0)
    probed, probed_reqs = _probe_run(1e-9)  # a probe before every step
    for ex in (plain, probed):
        ex.close()
    assert plain.probes == [] and len(plain.timings) == len(probed.timings) == 5
    assert [i for i, _ in probed.probes] == [0, 1, 2, 3, 4]
    assert all(t.seconds > 0 for _, t in probed.probes)
    assert [plain._tokens.get(r) for r in reqs] == [probed._tokens.get(r) for r in probed_reqs]
    assert plain.cache.lengths == probed.cache.lengths
    for x, y in zip((*plain.cache.k, *plain.cache.v), (*probed.cache.k, *probed.cache.v),
                    strict=True):
        assert bool((x == y).all())  # the borrowed slot is given back as found
    assert probed.probe_context == 31  # capacity 32: at most 31 cached tokens
    assert probed.probe_shape == BatchShape(num_decode_seqs=1, decode_context_tokens=32,
                                            num_sampled_seqs=1)


def test_probe_needs_a_free_slot() -> None:
    pytest.importorskip("torch")
    from calibration.executor import TorchExecutor

    ex = TorchExecutor(TINY, capacity=16, max_num_seqs=1, dtype="fp32", warmup=False)
    ex.close()
    a = _req(0, 3)
    ex._owner[:] = [a, a]  # every slot owned (one per sequence, plus the spare)
    assert ex.probe() is None and ex.probes == []
    ex._owner[:] = [a, None]
    assert ex.probe() is not None and [i for i, _ in ex.probes] == [0]
    assert ex.cache.lengths == [0, 0]
    with pytest.raises(ValueError, match="probe_every_s must be >= 0"):
        TorchExecutor(TINY, capacity=8, max_num_seqs=1, probe_every_s=-1.0)


def test_probe_summary_by_hand() -> None:
    from calibration.device_probe import Probes, probe_line

    # Calibration measured the probe at 0.1 s (the fit prices it 0.098 s); during the run
    # it took 0.1, 0.12 and 0.11 s: median 0.11, the device 10% slower than calibrated.
    p = Probes(128, 0.098, 0.1, (0, 5, 10), (0.1, 0.12, 0.11))
    pred, meas = [1.0] * 4, [1.1, 1.1, 1.0, 1.21]
    d = p.summary(10.0, pred, meas)
    assert d is not None
    assert d["drift_p50"] == pytest.approx(0.1 / 0.11 - 1)
    assert d["drift_min"] == pytest.approx(0.1 / 0.12 - 1)
    assert d["error_p50"] == pytest.approx(0.098 / 0.11 - 1)
    # Each step's error once the device's median slowdown (x 1.1) is taken out:
    # 1.1 / 1.1 - 1 = 0, 0, 1.1 / 1.0 - 1 = +0.1, 1.1 / 1.21 - 1 = -1/11.
    by_hand = [0.0, 0.0, 0.1, 1.1 / 1.21 - 1]
    assert d["step_bias_vs_probe"] == pytest.approx(sum(by_hand) / 4)
    # Without a calibrated figure the fit's price stands in for it.
    q = Probes(128, 0.1, None, (0,), (0.125,))
    dq = q.summary(5.0, [1.0], [1.25])
    assert dq is not None and dq["drift_p50"] == pytest.approx(-0.2)
    assert dq["step_bias_vs_probe"] == pytest.approx(0.0)
    assert probe_line(None) == "device probe: none"
    assert probe_line(d) == (
        "device probe (1 decode over 128 tokens, 3 probes, every 10 s of steps): "
        "calibration measured 100.0 ms, now p50 110.0 ms (100.0-120.0): device drift -9.1% "
        "at p50, -16.7% at the slowest probe; step bias with the drift taken out "
        f"{d['step_bias_vs_probe']:+.1%}")
    assert probe_line(dq).split(": ")[1].startswith("the profile prices it 100.0 ms")
    assert Probes.taken([], 128, 0.1) is None


def test_calibrated_seconds_reads_the_profiles_point() -> None:
    from calibration.device_probe import calibrated_seconds, probe_shape
    from calibration.profile import load_profile

    prof = load_profile(validation_config(None).profile or "")
    points = [mp for mp in prof.points if mp.shape == probe_shape(128)]
    assert len(points) == 1  # the default grid times a 1 x 128 decode
    assert calibrated_seconds(prof.points, probe_shape(128), "min") == points[0].seconds
    assert calibrated_seconds(prof.points, probe_shape(128), "median") == \
        points[0].seconds_median
    assert calibrated_seconds(prof.points, probe_shape(77), "min") is None


def test_device_mismatch_compares_cpu_kinds() -> None:
    pytest.importorskip("torch")
    from calibration.executor import TorchExecutor
    from calibration.measure import device_mismatch

    ex = TorchExecutor(TINY, capacity=8, max_num_seqs=1, dtype="fp32", warmup=False)
    ex.close()
    assert "torch threads; " in ex.device_name
    assert device_mismatch(ex.device_name, ex.device_name) is None
    zen3 = "AMD EPYC (2 cores, 1 torch threads; family 25 model 1, AVX2)"
    zen4 = "AMD EPYC (2 cores, 1 torch threads; family 25 model 17, AVX512 avx512_bf16)"
    assert device_mismatch(zen4, zen3) == (
        "the profile was measured on another CPU kind (family 25 model 17, AVX512 "
        "avx512_bf16) than this one (family 25 model 1, AVX2): calibrate here")
    # cores do not make another kind: the profile's thread count is what runs
    assert device_mismatch("AMD EPYC (16 cores, 1 torch threads; family 25 model 1, AVX2)",
                           zen3) is None
    old = device_mismatch("AMD EPYC (2 cores, 1 torch threads)", zen3)
    assert old is not None and old.startswith("the profile does not record its CPU kind")
    assert old.endswith("this CPU is family 25 model 1, AVX2: if that differs, calibrate here")
    assert device_mismatch("NVIDIA H100", "NVIDIA H200") == (
        "the profile was measured on NVIDIA H100, this device is NVIDIA H200")


# -- the comparison, no torch -------------------------------------------------------------


def test_error_figures() -> None:
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert relative_error(None, 1.0) is None and relative_error(1.0, 0.0) is None
    pred = {"throughput": {"requests_per_s": 2.0}, "e2e_latency_s": {"p50": 1.0}}
    meas = {"throughput": {"requests_per_s": 2.5}, "e2e_latency_s": {"p50": None}}
    rows = {r["metric"]: r for r in error_rows(pred, meas)}
    assert rows["throughput (req/s)"]["error"] == pytest.approx(-0.2)
    assert rows["E2E p50 (s)"]["error"] is None and rows["TTFT p99 (s)"]["measured"] is None
    e = step_error([1.0, 2.0, 3.0, 4.0], [1.0, 2.5, 2.0, 4.0])
    assert e["num_steps"] == 4 and e["bias"] == pytest.approx((0 - 0.2 + 0.5 + 0) / 4)
    assert e["mape"] == pytest.approx(0.7 / 4) and e["max_abs"] == pytest.approx(0.5)
    assert e["busy_time_error"] == pytest.approx(10 / 9.5 - 1)
    assert step_error([], [])["num_steps"] == 0
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_profile_threads_and_validation_config() -> None:
    assert profile_threads("AMD EPYC (2 cores, 1 torch threads)") == 1
    assert profile_threads("NVIDIA H100 80GB HBM3") is None
    cfg = validation_config(None, scenario="teaching", policy="static")
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) == (32, None, 2048)
    assert cfg.profile and cfg.profile.endswith("cpu-qwen2.5-0.5b.json")
    assert validation_config(None, max_num_seqs=4).max_num_seqs == 4
    assert cache_capacity(make_prep()) == 4 + 8 + 1
    assert math.isfinite(cache_capacity(make_prep(max_model_len=5)))


def test_the_real_run_takes_the_profiles_fit_statistic(tmp_path: Path) -> None:
    # A profile fitted to median rounds is compared with the median of the real step's
    # repeats, one fitted to the fastest with the fastest (calibration.fit.chosen_run).
    from calibration.profile import load_profile, save_profile
    from sim.app.runs.validate import prepare_validation

    shipped = load_profile(validation_config(None).profile or "")
    for statistic in ("min", "median"):
        path = tmp_path / f"{statistic}.json"
        save_profile(dataclasses.replace(
            shipped, fit=dataclasses.replace(shipped.fit, statistic=statistic)), path)
        cfg = validation_config(str(path), scenario="teaching", num_requests=2)
        assert prepare_validation(cfg, repeats=3)[1].statistic == statistic


# -- the command --------------------------------------------------------------------------


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["validate", *args])


def test_validate_command_writes_files_and_prints_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped profile prices the run; the real run uses the tiny model (the
    profile's 0.5B model would take minutes here)."""
    pytest.importorskip("torch")
    import sim.app.runs.validate as validate

    real_prepare = validate.prepare_validation

    def tiny(*args: Any, **kwargs: Any) -> Any:
        prep, _ = real_prepare(*args, **kwargs)
        return prep, dataclasses.replace(TINY_REAL, repeats=2)

    monkeypatch.setattr(validate, "prepare_validation", tiny)
    out = tmp_path / "v"
    res = _invoke("--scenario", "teaching", "--policy", "static", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "E2E p99 (s)" in res.stdout and "same schedule in both runs" in res.stdout
    data = json.loads((out / "validation.json").read_text())
    assert data["format"] == "servesim-validation" and data["real"]["repeats"] == 2
    assert data["config"]["max_num_seqs"] == 32 and data["same_schedule"]
    assert "device probe (1 decode over" in res.stdout and data["device_probe"]["measured_s"]
    html = (out / "validation.html").read_text()
    assert html.count("<script type=\"text/javascript\">") == 1 and "figure-3" in html
    # The probes (the first before step 0, the last after the run) on the error panel.
    assert "device probe (drift)" in html and "bias with the drift taken out" in html
    assert (out / "measured" / "summary.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (("--device", "cuda"), "differs from the profile's device"),
    (("--device", ""), "device must name a torch device"),
    (("--profile", "nope.json"), "cannot read profile"),
    (("--scenario", "nope"), "scenario must be one of"),
    (("--timer", "sundial"), "timer must be one of"),
    (("--repeats", "0"), "repeats must be >= 1"),
    (("--probe-every-s", "-1"), "probe_every_s must be >= 0"),
    (("--engine", "vllm", "--probe-every-s", "5"), "probe_every_s applies to the torch"),
    (("--against", "r.json", "--probe-every-s", "5"), "probe_every_s applies to a real run"),
    (("--model", "llama-3.1-8b"), "model applies only with --against"),
    (("--frontend-ttft-s", "0.01"), "frontend_ttft_s applies only with --against"),
    (("--fit-frontend",), "fit_frontend applies only with --against"),
])
def test_validate_command_bad_input(args: tuple[str, ...], message: str,
                                    tmp_path: Path) -> None:
    res = _invoke("--scenario", "teaching", *args, "--out", str(tmp_path / "v"))
    assert res.exit_code == 1
    assert message in res.stderr and "Traceback" not in res.output
