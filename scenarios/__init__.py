"""servesim's workloads: what arrives and when.

Arrival processes (``arrivals``), length models (``lengths``), trace loaders (``traces``),
named presets (``presets``), the immutable ``Workload`` table (``workload``) and
``build_workload``, the one function the CLI calls. Imports nothing from sim/, policies/ or
calibration/. Randomness only through an explicitly passed ``numpy.random.Generator``.
The names below are imported from their modules when first read, so importing one module
of this package (a trace run reads no preset) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scenarios.arrivals import ARRIVAL_PROCESSES, bursts, constant, gamma, gamma_gaps, poisson
    from scenarios.build import build_workload
    from scenarios.lengths import Empirical, Fixed, Independent, InOrder, LogNormal, Uniform
    from scenarios.presets import ScenarioSpec, get_scenario, list_scenarios
    from scenarios.traces import TRACE_FORMATS, load_lengths, load_trace, save_trace
    from scenarios.workload import Workload

__all__ = [
    "ARRIVAL_PROCESSES",
    "TRACE_FORMATS",
    "Empirical",
    "Fixed",
    "InOrder",
    "Independent",
    "LogNormal",
    "ScenarioSpec",
    "Uniform",
    "Workload",
    "build_workload",
    "bursts",
    "constant",
    "gamma",
    "gamma_gaps",
    "get_scenario",
    "list_scenarios",
    "load_lengths",
    "load_trace",
    "poisson",
    "save_trace",
]

#: Each public name's module.
_HOMES = {
    **dict.fromkeys(("ARRIVAL_PROCESSES", "bursts", "constant", "gamma", "gamma_gaps",
                     "poisson"), "scenarios.arrivals"),
    "build_workload": "scenarios.build",
    **dict.fromkeys(("Empirical", "Fixed", "Independent", "InOrder", "LogNormal", "Uniform"),
                    "scenarios.lengths"),
    **dict.fromkeys(("ScenarioSpec", "get_scenario", "list_scenarios"), "scenarios.presets"),
    **dict.fromkeys(("TRACE_FORMATS", "load_lengths", "load_trace", "save_trace"),
                    "scenarios.traces"),
    "Workload": "scenarios.workload",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
