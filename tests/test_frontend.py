"""calibration/frontend.py: the API server's term on client-side times, and its least-squares
fit, on numbers computed by hand and on synthetic data whose true term is known."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.frontend import Frontend, fit_frontend

NAN = float("nan")


def test_client_view_adds_the_term_by_hand() -> None:
    f = Frontend(ttft_s=0.02, token_s=0.001)
    ttft, tpot, e2e = f.client_view(np.array([0.1, 0.2, NAN]), np.array([0.01, NAN, NAN]),
                                    np.array([0.5, 0.2, NAN]), np.array([41, 1, 3]))
    assert ttft[:2] == pytest.approx([0.12, 0.22]) and np.isnan(ttft[2])
    assert tpot[0] == pytest.approx(0.011) and np.isnan(tpot[1:]).all()
    # E2E: + ttft_s + (n - 1) token_s = 0.5 + 0.02 + 40 * 0.001; one token: + ttft_s only
    assert e2e[:2] == pytest.approx([0.56, 0.22]) and np.isnan(e2e[2])
    assert Frontend().finish_delay(np.array([1, 9])).tolist() == [0.0, 0.0]
    assert f.describe() == "20.0 ms before the first token, 1.000 ms per output token"


@pytest.mark.parametrize(("ttft_s", "token_s", "name"), [
    (-0.1, 0.0, "frontend_ttft_s"), (0.0, float("inf"), "frontend_token_s"),
    (NAN, 0.0, "frontend_ttft_s")])
def test_frontend_refuses_bad_values(ttft_s: float, token_s: float, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be a finite number >= 0"):
        Frontend(ttft_s, token_s)


def test_fit_recovers_a_known_term_exactly() -> None:
    """Synthetic 'measurements': the simulation plus a true term of 15 ms and 0.5 ms."""
    rng = np.random.default_rng(0)
    n = rng.integers(1, 200, size=50)
    sim_ttft = rng.uniform(0.01, 0.5, size=50)
    sim_tpot = rng.uniform(0.005, 0.05, size=50)
    sim_e2e = sim_ttft + (n - 1) * sim_tpot
    meas_ttft, _, meas_e2e = Frontend(0.015, 0.0005).client_view(sim_ttft, sim_tpot, sim_e2e, n)
    fit = fit_frontend(sim_ttft, sim_e2e, meas_ttft, meas_e2e, n)
    assert fit.frontend.ttft_s == pytest.approx(0.015, abs=1e-12)
    assert fit.frontend.token_s == pytest.approx(0.0005, abs=1e-12)
    assert fit.fitted == ("ttft_s", "token_s") and fit.num_requests == 50
    assert fit.num_gaps == int((n - 1).sum())


def test_fit_least_squares_by_hand() -> None:
    """Three requests: TTFT differences 0.04, 0.05, 0.03 -> mean 0.04; decode-time
    differences 0.04 over 3 gaps, 0.03 over 2, 0 over 0 -> 0.07 / 5 = 0.014 (each gap
    weighted once). A request unfinished in the simulation (NaN) is left out."""
    fit = fit_frontend(sim_ttft_s=[0.01, 0.01, 0.01, NAN], sim_e2e_s=[0.04, 0.03, 0.01, NAN],
                       meas_ttft_s=[0.05, 0.06, 0.04, 0.3], meas_e2e_s=[0.12, 0.11, 0.04, 0.9],
                       num_output_tokens=[4, 3, 1, 9])
    assert fit.frontend.ttft_s == pytest.approx(0.04)
    assert fit.frontend.token_s == pytest.approx(0.014)
    assert (fit.num_requests, fit.num_gaps) == (3, 5)
    assert fit.raw_ttft_s == pytest.approx(0.04) and fit.raw_token_s == pytest.approx(0.014)


def test_fit_clamps_at_zero_and_holds_given_terms() -> None:
    # the simulation is 10 ms slower to the first token than the 'server': no delay fits
    fit = fit_frontend([0.06], [0.16], [0.05], [0.17], [11])
    assert fit.frontend.ttft_s == 0.0 and fit.raw_ttft_s == pytest.approx(-0.01)
    assert fit.frontend.token_s == pytest.approx((0.12 - 0.10) / 10)
    held = fit_frontend([0.06], [0.16], [0.05], [0.17], [11], ttft_s=0.003)
    assert held.frontend.ttft_s == 0.003 and held.fitted == ("token_s",)
    assert held.raw_ttft_s is None
    one_token = fit_frontend([0.06], [0.06], [0.08], [0.08], [1])
    assert one_token.frontend.token_s == 0.0 and one_token.raw_token_s is None
    assert one_token.num_gaps == 0


def test_fit_needs_a_request_finished_in_both() -> None:
    with pytest.raises(ValueError, match=r"^frontend: no request finished in both"):
        fit_frontend([NAN], [NAN], [0.1], [0.2], [2])
