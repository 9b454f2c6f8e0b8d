"""The API server's share of what a client measures: a per-request delay before the first
token and a per-token streaming cost, added to a simulated request's engine-side times, and
their least-squares fit to a measured run (servesim validate --against).

A client of ``vllm serve`` times more than the engine: HTTP, the chat template and
tokenization before the engine sees the request, detokenization and server-sent events
after each step. The engine's steps stay as the cost model prices them; only the times a
client records change. For a request with n output tokens whose simulated TTFT is T,
TPOT P and E2E latency E (s), a ``Frontend(ttft_s=d, token_s=c)`` gives the client's

    TTFT' = T + d,   TPOT' = P + c,   every ITL + c,   E2E' = E + d + (n - 1) c

(the first token's own streaming is inside d, so d is exactly the TTFT offset and c the
ITL offset). Arrivals, the schedule and queueing are the engine's: the term does not delay
a request's admission.

The fit (``fit_frontend``) is least squares on the per-request differences, measured minus
simulated, over the requests finished in both runs. The two terms are separate unknowns:

- d minimises sum_i (dTTFT_i - d)^2: the mean TTFT difference;
- c minimises sum_i (n_i - 1) (dTPOT_i - c)^2, i.e. each of a request's n_i - 1 gaps
  compared with its simulated mean gap: c = sum_i dDecode_i / sum_i (n_i - 1), where
  dDecode_i = (E_i - T_i) measured minus simulated is the difference in decode time.

A server adds time and never removes it, so each is clamped at 0 (the problem separates,
so this is the non-negative least-squares solution); the unclamped values are kept
(``raw_ttft_s``, ``raw_token_s``): a negative one says the simulation is already slower
than the real server on that figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Frontend:
    """Seconds the API server adds: ``ttft_s`` before a request's first token,
    ``token_s`` to each gap between two of its tokens. Raises ValueError (naming
    frontend_ttft_s / frontend_token_s) for a value that is not finite and >= 0."""

    ttft_s: float = 0.0
    token_s: float = 0.0

    def __post_init__(self) -> None:
        for name, v in (("frontend_ttft_s", self.ttft_s), ("frontend_token_s", self.token_s)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 seconds, got {v}")

    def client_view(self, ttft_s: npt.ArrayLike, tpot_s: npt.ArrayLike, e2e_s: npt.ArrayLike,
                    num_output_tokens: npt.ArrayLike
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TTFT', TPOT', E2E') from engine-side per-request times (s; NaN stays NaN)."""
        return (np.asarray(ttft_s, dtype=np.float64) + self.ttft_s,
                np.asarray(tpot_s, dtype=np.float64) + self.token_s,
                np.asarray(e2e_s, dtype=np.float64) + self.finish_delay(num_output_tokens))

    def finish_delay(self, num_output_tokens: npt.ArrayLike) -> np.ndarray:
        """Seconds a request's last token reaches the client later: ttft_s + (n - 1)
        token_s (exactly 0 for the zero term)."""
        gaps = np.maximum(np.asarray(num_output_tokens, dtype=np.float64) - 1, 0)
        return self.ttft_s + gaps * self.token_s

    def describe(self) -> str:
        """'12.0 ms before the first token, 0.400 ms per output token'."""
        return (f"{self.ttft_s * 1e3:.1f} ms before the first token, "
                f"{self.token_s * 1e3:.3f} ms per output token")


@dataclass(frozen=True, slots=True)
class FrontendFit:
    """A fitted (or partly given) term: ``frontend`` the term applied; ``fitted`` the
    names fitted ("ttft_s", "token_s"; a given one is held); ``raw_*`` the unclamped
    least-squares values (None when not fitted, or no data: token_s with no multi-token
    request); ``num_requests`` pairs used, ``num_gaps`` output-token gaps used."""

    frontend: Frontend
    fitted: tuple[str, ...]
    raw_ttft_s: float | None
    raw_token_s: float | None
    num_requests: int
    num_gaps: int


def fit_frontend(sim_ttft_s: npt.ArrayLike, sim_e2e_s: npt.ArrayLike,
                 meas_ttft_s: npt.ArrayLike, meas_e2e_s: npt.ArrayLike,
                 num_output_tokens: npt.ArrayLike, ttft_s: float | None = None,
                 token_s: float | None = None) -> FrontendFit:
    """Fit the terms not given (``ttft_s`` / ``token_s`` None) to paired per-request
    times (s, same order; NaN where a request did not finish in a run: left out), as the
    module docstring says. Raises ValueError when no request finished in both runs."""
    sim_t, sim_e, meas_t, meas_e = (np.asarray(a, dtype=np.float64) for a in (
        sim_ttft_s, sim_e2e_s, meas_ttft_s, meas_e2e_s))
    n = np.asarray(num_output_tokens, dtype=np.float64)
    both = np.isfinite(sim_t) & np.isfinite(sim_e) & np.isfinite(meas_t) & np.isfinite(meas_e)
    if not both.any():
        raise ValueError("frontend: no request finished in both the simulation and the "
                         "result; nothing to fit")
    gaps = np.maximum(n[both] - 1, 0)
    num_gaps = int(gaps.sum())
    raw_d = raw_c = None
    fitted = []
    if ttft_s is None:
        raw_d = float(np.mean(meas_t[both] - sim_t[both]))
        ttft_s = max(raw_d, 0.0)
        fitted.append("ttft_s")
    if token_s is None:
        fitted.append("token_s")
        if num_gaps:
            decode = (meas_e[both] - meas_t[both]) - (sim_e[both] - sim_t[both])
            raw_c = float(decode.sum() / num_gaps)
        token_s = max(raw_c or 0.0, 0.0)
    return FrontendFit(Frontend(ttft_s, token_s), tuple(fitted), raw_d, raw_c,
                       int(both.sum()), num_gaps)
