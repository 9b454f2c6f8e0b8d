"""calibration.fit: features, held-out split, recovery of known coefficients, refusal."""

from __future__ import annotations

import pytest

from calibration.fit import FEATURES, FitRejected, feature_vector, fit_points, heldout_mask
from calibration.grid import REGIONS, GridConfig, GridPoint, MeasuredPoint, make_grid
from sim.batch import shape_of
from sim.request import Request

TRUE = {"step": 0.05, "tokens": 2e-4, "tokens_over_knot": 3e-3,
        "prefill_attention_pairs": 1e-8, "prefill_context_tokens": 4e-6,
        "decode_context_tokens": 2e-6, "seqs": 1e-4, "sampled_seqs": 5e-3, "lm_head": 0.02}


def make_points(coefs: dict[str, float] = TRUE, knot: int | None = 32,
                noise: dict[str, float] | None = None,
                grid: GridConfig | None = None) -> list[MeasuredPoint]:
    """Synthetic measurements: seconds = coefs . features, times (1 + noise[region]) on
    alternate points of that region."""
    out = []
    for p in make_grid(grid or GridConfig()):
        t = sum(coefs[f] * x for f, x in zip(FEATURES, feature_vector(p.shape, knot), strict=True))
        if noise and p.index % 2:
            t *= 1 + noise.get(p.region, 0.0)
        out.append(MeasuredPoint(p, t, t, t, 1))
    return out


def test_noiseless_fit_recovers_coefficients_exactly() -> None:
    fit = fit_points(make_points())
    assert fit.knot_tokens == 32
    for name, got in zip(FEATURES, fit.coefficients, strict=True):
        assert got == pytest.approx(TRUE[name], rel=1e-6, abs=1e-12), name
    assert fit.status == "accepted"
    for region in REGIONS:
        err = fit.errors[region]
        assert err.num_heldout >= 1 and err.mape is not None and err.mape < 1e-6


def test_zero_coefficients_stay_zero_and_no_knot() -> None:
    coefs = {**TRUE, "tokens_over_knot": 0.0, "seqs": 0.0}
    fit = fit_points(make_points(coefs, knot=None))
    got = dict(zip(FEATURES, fit.coefficients, strict=True))
    assert got["seqs"] == pytest.approx(0.0, abs=1e-12)
    assert got["tokens"] == pytest.approx(TRUE["tokens"], rel=1e-6)
    assert fit.predict(make_points()[0].shape) > 0


def test_bad_region_is_refused_then_forced() -> None:
    points = make_points(noise={"decode": 0.6})
    with pytest.raises(FitRejected) as info:
        fit_points(points)
    assert info.value.region == "decode"
    assert "decode" in str(info.value) and isinstance(info.value, ValueError)
    assert info.value.fit.status == "rejected"
    forced = fit_points(points, force=True)
    assert forced.status == "forced"


def test_heldout_split_is_deterministic_spread_and_order_free() -> None:
    points = make_points()
    mask = heldout_mask(points)
    for region in REGIONS:
        flags = [h for p, h in zip(points, mask, strict=True) if p.region == region]
        assert sum(flags) == -(-len(flags) // 4)
    reversed_mask = heldout_mask(points[::-1])[::-1]
    assert reversed_mask == mask
    held = {p.point.index for p, h in zip(points, mask, strict=True) if h and p.region == "prefill"}
    assert len({i // 4 for i in held}) > 1  # not one row of the lattice


def test_too_few_points_and_bad_limit() -> None:
    with pytest.raises(ValueError, match="points"):
        fit_points(make_points()[:5])
    with pytest.raises(ValueError, match="max_mape"):
        fit_points(make_points(), max_mape=0)


def test_grid_point_shape_matches_simulator_shape() -> None:
    """GridPoint.shape prices the same work sim.batch.shape_of derives from requests."""
    p = GridPoint("mixed", 0, decode_seqs=3, decode_context=40, chunk_tokens=17,
                  chunk_context=9, chunk_sample=True)
    decodes = []
    for i in range(3):
        r = Request(f"d{i}", 0.0, 20, 100, 100, 0, i)
        r.num_computed_tokens, r.num_output_tokens = 40, 20
        decodes.append((r, 1))
    chunk = Request("c", 0.0, 26, 5, 5, 0, 9)
    chunk.num_computed_tokens = 9
    assert p.shape == shape_of([*decodes, (chunk, 17)])


def test_grid_spans_limits_and_validates() -> None:
    cfg = GridConfig(max_num_seqs=8, max_num_batched_tokens=128, max_context=512)
    grid = make_grid(cfg)
    assert {p.region for p in grid} == set(REGIONS)
    assert max(p.shape.num_tokens for p in grid) == 128
    assert max(p.decode_seqs for p in grid) == 8
    assert all(p.shape.num_tokens <= 128 and p.shape.num_seqs <= 8 for p in grid)
    assert all(p.chunk_context + p.chunk_tokens <= 512 and p.decode_context < 512
               for p in grid)
    with pytest.raises(ValueError, match="max_num_seqs"):
        GridConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_context"):
        GridConfig(max_num_batched_tokens=512, max_context=100)


def test_a_median_fit_recovers_the_median_runs_coefficients() -> None:
    # Each point's median run is the fastest scaled by 1.1: fitted on "median" the model
    # recovers 1.1 x TRUE (relative error is scale-free); on "min", TRUE itself.
    points = [MeasuredPoint(p.point, p.seconds, 1.1 * p.seconds, 1.2 * p.seconds, 3)
              for p in make_points()]
    on_min, on_median = fit_points(points), fit_points(points, statistic="median")
    assert (on_min.statistic, on_median.statistic) == ("min", "median")
    for name, a, b in zip(FEATURES, on_min.coefficients, on_median.coefficients, strict=True):
        assert a == pytest.approx(TRUE[name], rel=1e-6, abs=1e-12), name
        assert b == pytest.approx(1.1 * TRUE[name], rel=1e-6, abs=1e-12), name
    with pytest.raises(ValueError, match="statistic"):
        fit_points(points, statistic="max")


def test_the_fit_statistic_is_recorded_and_old_records_read_as_min() -> None:
    from calibration.fit import FitResult

    fit = fit_points(make_points(), statistic="median")
    record = fit.to_dict()
    assert record["statistic"] == "median" and FitResult.from_dict(record) == fit
    del record["statistic"]  # a profile from before the field
    assert FitResult.from_dict(record).statistic == "min"
    with pytest.raises(ValueError, match=r"fit\.statistic"):
        FitResult.from_dict({**record, "statistic": "mean"})


def test_the_default_statistic_follows_the_clock() -> None:
    from calibration.fit import default_statistic

    assert default_statistic("thread") == "median"
    assert default_statistic("wall") == "min"


def test_the_run_a_statistic_picks() -> None:
    from calibration.fit import chosen_run

    runs = [0.30, 0.10, 0.20, 0.50]
    assert chosen_run(runs, "min") == 1  # 0.10
    assert chosen_run(runs, "median") == 2  # 0.10 0.20 | 0.30 0.50: the lower middle
    assert chosen_run(runs[:3], "median") == 2  # 0.10 0.20 0.30: 0.20
    assert chosen_run([0.4], "median") == 0
    with pytest.raises(ValueError, match="no runs"):
        chosen_run([], "min")
    with pytest.raises(ValueError, match="statistic"):
        chosen_run(runs, "max")
