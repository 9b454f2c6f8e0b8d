"""The one entry point the CLI calls to turn flags into a Workload.

Owns the precedence rules between a trace, a named scenario and the override flags, and the
seeding: ``SeedSequence(seed)`` spawns two independent child generators, one for arrivals
and one for lengths (common random numbers), so changing the arrival process or the rate
never changes the request lengths, and the same seed always gives the same workload.

A re-timed trace asked for more requests than it has rows is oversampled as vLLM's
benchmark datasets are (vllm/benchmarks/datasets.py ``maybe_oversample_requests``;
Workload.oversampled), by the length generator, and its source says so; a trace replayed
with its own arrivals is not (it ends where the trace ends).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scenarios.arrivals import generate
from scenarios.diurnal import (
    DEFAULT_AMPLITUDE,
    check_amplitude,
    partial_day_note,
    realised_rate,
)
from scenarios.trace_cache import load_trace_cached
from scenarios.workload import Workload

if TYPE_CHECKING:
    from scenarios.presets import ScenarioSpec


def _process_label(process: str, rate: float, burstiness: float,
                   amplitude: float = DEFAULT_AMPLITUDE) -> str:
    if process == "gamma":
        return f"gamma(rate={rate:g}, burstiness={burstiness:g})"
    if process == "diurnal":
        return f"diurnal(rate={rate:g}, amplitude={amplitude:g}, period 24 h)"
    return f"{process}({rate:g})"


def _mean_rate(workload: Workload) -> float:
    """Requests per second: (n - 1) / (last - first arrival); inf when there is no span."""
    span = float(workload.arrival_time[-1] - workload.arrival_time[0]) if len(workload) else 0.0
    return (len(workload) - 1) / span if span > 0 else math.inf


def _with_diurnal_note(workload: Workload, rate: float) -> Workload:
    """``workload`` whose arrivals the diurnal process drew at mean ``rate`` req/s, with
    the rate they realise in its source and, when they cover less than a day, a note
    (scenarios.diurnal.partial_day_note)."""
    note = partial_day_note(workload.arrival_time, rate)
    return dataclasses.replace(
        workload, source=f"{workload.source}, realised "
                         f"{realised_rate(workload.arrival_time):.3g} req/s",
        notes=(*workload.notes, *([note] if note else [])))


def _from_trace(trace: Path, trace_format: str | None, arrival: str | None, rate: float | None,
                burstiness: float | None, num_requests: int | None, window_s: float | None,
                rng: np.random.Generator, length_rng: np.random.Generator,
                trace_sample: bool, tokenizer: str | None,
                amplitude: float) -> Workload:
    """build_workload's trace side: ``rng`` re-times, ``length_rng`` draws the sample
    (``trace_sample``) and the oversampled copies."""
    sample_rng = length_rng if trace_sample else None
    if arrival is None and burstiness is not None:
        arrival = "gamma"
    if arrival is None and rate is not None:
        arrival = "poisson"  # vllm bench serve's --request-rate: Poisson gaps at that rate
    if sample_rng is None:
        # A time-ordered file is read only as far as the cut; a length-only file is
        # read when a rate re-times it (else refused, saying to give --rate).
        workload = load_trace_cached(trace, trace_format, num_requests=num_requests,
                                     window_s=window_s, retimed=rate is not None,
                                     tokenizer=tokenizer)
    else:
        if num_requests is None:
            raise ValueError("trace_sample needs num_requests (how many to draw)")
        full = load_trace_cached(trace, trace_format, window_s=window_s,
                                 retimed=rate is not None, tokenizer=tokenizer)
        # Re-timed requests are also shuffled: a trace's lengths drift over its day, and a
        # steady-rate probe should see a steady mix.
        workload = dataclasses.replace(
            full.sampled(num_requests, sample_rng, shuffle=arrival is not None),
            source=f"{full.source}, {min(num_requests, len(full))} drawn at random")
    if arrival is None:
        return workload
    # The trace's own rate, before oversampling: the copies keep the span, so measuring
    # after would multiply it by num_requests / rows.
    rate = _mean_rate(workload) if rate is None else rate
    if num_requests is not None and num_requests > len(workload):
        workload = dataclasses.replace(
            workload.oversampled(num_requests, length_rng),
            source=f"{workload.source}, {len(workload):,} rows oversampled to "
                   f"{num_requests:,} (copies drawn with replacement)")
    k = 1.0 if burstiness is None else burstiness
    times = generate(arrival, rate, len(workload), rng, burstiness=k, amplitude=amplitude)
    label = _process_label(arrival, rate, k, amplitude)
    workload = dataclasses.replace(workload.retimed(times),
                                   source=f"{workload.source}, re-timed {label}")
    return _with_diurnal_note(workload, rate) if arrival == "diurnal" else workload


def _from_scenario(spec: ScenarioSpec, arrival: str | None, rate: float | None,
                   burstiness: float | None, num_requests: int | None,
                   window_s: float | None, arrival_rng: np.random.Generator,
                   length_rng: np.random.Generator,
                   amplitude: float = DEFAULT_AMPLITUDE) -> Workload:
    if arrival is None:
        arrival = "gamma" if burstiness is not None else spec.arrival
    k = spec.burstiness if burstiness is None else burstiness
    rate = spec.rate if rate is None else rate
    n = spec.num_requests if num_requests is None else num_requests
    if int(n) != n or n < 1:
        raise ValueError(f"num_requests must be an integer >= 1, got {n!r}")
    prompt, output = spec.lengths.sample(int(n), length_rng)
    times = generate(arrival, rate, int(n), arrival_rng, burstiness=k,
                     burst_size=spec.burst_size, amplitude=amplitude)
    source = (f"{spec.name}: {_process_label(arrival, rate, k, amplitude)} x "
              f"{spec.lengths.describe()}")
    workload = Workload.from_arrays(times, prompt, output, source=source)
    if spec.prefix is not None:  # prompt content, drawn after the lengths
        workload = spec.prefix.apply(workload, length_rng)
        workload = dataclasses.replace(workload, source=f"{source} x {spec.prefix.describe()}")
    workload = workload.cut(None, window_s).with_max_tokens(spec.max_tokens)
    return _with_diurnal_note(workload, rate) if arrival == "diurnal" else workload


def _generators(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The arrival and the length generator of ``seed``: two independent children of
    ``SeedSequence(seed)`` (module docstring). Raises ValueError unless ``seed`` is an
    integer >= 0."""
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    arrival_rng, length_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence(int(seed)).spawn(2)
    )
    return arrival_rng, length_rng


def _check_time_scale(time_scale: float | None, arrival: str | None, rate: float | None,
                      burstiness: float | None) -> None:
    """ValueError for ``time_scale`` beside a process that re-generates the arrivals: the
    two would multiply (--rate 5 --time-scale 2 offers 10 req/s)."""
    if time_scale is not None and (arrival, rate, burstiness) != (None, None, None):
        raise ValueError(f"time_scale {time_scale:g} speeds up the arrivals as given, and "
                         "rate/arrival/burstiness draw new ones: give the rate you want, or "
                         "time_scale alone")


def _process_shape(arrival: str | None, rate: float | None, burstiness: float | None,
                   time_scale: float | None, amplitude: float | None) -> float:
    """The diurnal process's amplitude: the one given (checked), else the default;
    ValueError for a burstiness or an amplitude given with another process, or a
    time_scale with a process (_check_time_scale)."""
    _check_time_scale(time_scale, arrival, rate, burstiness)
    if burstiness is not None and arrival not in (None, "gamma"):
        raise ValueError(f"burstiness applies to arrival 'gamma' only, got arrival {arrival!r}")
    if amplitude is None:
        return DEFAULT_AMPLITUDE
    if arrival != "diurnal":
        raise ValueError(f"diurnal_amplitude applies to arrival 'diurnal' only, got "
                         f"arrival {arrival!r}")
    check_amplitude(amplitude)
    return amplitude


def _preset(scenario: str | None) -> ScenarioSpec:
    """The preset ``scenario`` names (default "default"); the presets' module is imported
    only here, so a trace run never loads it."""
    from scenarios.presets import get_scenario

    return get_scenario("default" if scenario is None else scenario)


def _check_without_trace(trace_format: str | None, trace_sample: bool) -> None:
    """ValueError for a trace option given without a trace."""
    if trace_format is not None:
        raise ValueError("trace_format applies only with a trace")
    if trace_sample:
        raise ValueError("trace_sample applies only with a trace")


def build_workload(
    *,
    trace: Path | None,
    trace_format: str | None,
    scenario: str | None,
    arrival: str | None,
    rate: float | None,
    burstiness: float | None,
    num_requests: int | None,
    window_s: float | None,
    time_scale: float | None,
    max_tokens: int | None,
    seed: int,
    trace_sample: bool = False,
    tokenizer: str | None = None,
    diurnal_amplitude: float | None = None,
) -> Workload:
    """The workload a run simulates, deterministic for ``seed``.

    - ``trace`` given: replay its own arrivals. ``num_requests`` / ``window_s`` (s) cut it
      first (the first N requests / those within window_s of the first arrival). With
      ``arrival`` (scenarios.arrivals.ARRIVAL_PROCESSES) the cut requests keep their
      lengths in order and get new arrival times from that process at ``rate`` req/s
      (default: the trace's mean rate). ``burstiness`` alone implies ``arrival="gamma"``,
      ``rate`` alone ``arrival="poisson"`` (as vllm bench serve's --request-rate re-times
      any dataset; ``time_scale`` replays the trace's own arrivals faster). With
      ``trace_sample`` the ``num_requests`` are drawn at random (without replacement, in
      trace order) from the whole trace instead of taken from its start, by the seed's
      length generator, so every rate or process sees the same sample; a re-timed trace
      short of them is oversampled (module docstring).
    - no trace: the named ``scenario`` (default "default") generates ``num_requests``
      requests; ``arrival``, ``rate``, ``burstiness`` override the scenario's (burstiness
      alone switches the process to gamma); ``window_s`` then cuts.
    - then ``time_scale`` is a speedup: arrival times divided by it (2 = twice the rate),
      and ``max_tokens`` caps every request (tokens, None = keep); ``tokenizer`` counts a
      ShareGPT trace's tokens (a tokenizer.json; ignored without a trace: RunConfig checks).

    Raises:
        ValueError: both ``trace`` and ``scenario``; ``trace_format`` without a trace;
            ``burstiness`` or ``diurnal_amplitude`` with another ``arrival``; ``time_scale``
            with a process that re-times; a negative ``seed``; a value out of range.
        FileNotFoundError: the trace file does not exist.
    """
    arrival_rng, length_rng = _generators(seed)
    amplitude = _process_shape(arrival, rate, burstiness, time_scale, diurnal_amplitude)
    if trace is not None:
        if scenario is not None:
            raise ValueError("give either trace or scenario, not both")
        workload = _from_trace(Path(trace), trace_format, arrival, rate, burstiness,
                               num_requests, window_s, arrival_rng, length_rng,
                               trace_sample, tokenizer, amplitude)
    else:
        _check_without_trace(trace_format, trace_sample)
        spec = _preset(scenario)
        workload = _from_scenario(spec, arrival, rate, burstiness, num_requests, window_s,
                                  arrival_rng, length_rng, amplitude)
    if time_scale is not None:
        workload = dataclasses.replace(workload.time_scaled(time_scale),
                                       source=f"{workload.source}, time x{time_scale:g} speed")
    return workload.with_max_tokens(max_tokens)
