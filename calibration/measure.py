"""Timing real engine steps on a random-weight torch decoder.

Owns: :func:`measure` (warm-up, interleaved timed rounds, CUDA synchronisation, peak
memory, a rich progress bar with time left, the time budget), :class:`Measurement` (what
it returns, also for the vLLM engine: calibration/vllm_measure.py) and the step clocks
(:data:`TIMERS`, :func:`resolve_timer`). The grid and the point records live in
calibration/grid.py. torch is imported inside :func:`measure` only (this module and
calibration/torch_model.py are its only importers).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from calibration.grid import GridConfig, GridPoint, MeasuredPoint, make_grid

if TYPE_CHECKING:
    from calibration.specs import ModelSpec

TIMERS = ("auto", "thread", "wall")
"""Step clocks: thread = the measuring thread's CPU time (time.thread_time), wall =
perf_counter (CUDA synchronised), auto = thread on CPU with one thread, else wall."""


def resolve_timer(timer: str, device: str, threads: int | None) -> str:
    """"thread" or "wall" for ``timer`` on ``device`` with ``threads`` compute threads
    (None: the library's default, several). The thread clock counts only while the step
    runs on that thread, so other processes' time on the core is left out (a shared CPU
    inflates wall-clock steps several-fold); it misses other threads' and a GPU's work,
    so it needs device cpu and one thread. Raises ValueError naming timer otherwise."""
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    single = device == "cpu" and threads == 1
    if timer == "thread" and not single:
        raise ValueError("timer 'thread' needs device cpu and threads 1 (the thread's CPU "
                         "time misses other threads' and the GPU's work)")
    if timer == "auto":
        return "thread" if single else "wall"
    return timer


@dataclass(frozen=True, slots=True)
class Measurement:
    """What :func:`measure` returns: the measured points (in measuring order), the setup
    they were measured under, memory figures (bytes) and the wall time spent. ``engine``:
    which engine ran the steps ("name": torch or vllm), the clock ("timer") and the
    engine's own facts (vLLM's version, start-up figures, per-phase split)."""

    points: tuple[MeasuredPoint, ...]
    grid: GridConfig
    num_layers: int
    dtype: str
    device: str
    device_name: str
    torch_version: str
    memory: dict[str, Any]
    elapsed_s: float
    num_planned: int
    engine: dict[str, Any] = field(default_factory=lambda: {"name": "torch"})


BF16_ISA = ("avx512f", "avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags that decide how fast torch runs bf16 GEMMs on a CPU: without
AVX-512 torch 2.13 has no oneDNN bf16 path and falls back to a slow generic kernel (one
core of an AVX2 EPYC, family 25 model 1: 8-9 GFLOP/s in bf16 against 36 in fp32, where
the shipped profile's 3.6 ms per token and layer stack implies about 200, only reachable
with bf16 dot-product instructions)."""


def cpu_kind(capability: str, cpuinfo: str) -> str:
    """The CPU kind a timing belongs to, from torch's kernel level (``capability``, e.g.
    "AVX2") and the text of /proc/cpuinfo: "family F model M, AVX2" plus any of
    :data:`BF16_ISA` present. A hypervisor often reports the same model name for CPU
    generations of very different speed (both Zen 3 and Zen 4 VMs read "AMD EPYC"), so the
    family, model and instruction sets are what tells two machines apart."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    isa = " ".join([capability, *(f for f in BF16_ISA if f in flags)])
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}, {isa}"
    return isa


def device_name(torch: Any, device: Any) -> str:
    """The device as a profile names it: the GPU's name, or on CPU "MODEL NAME (N cores,
    T torch threads; CPU KIND)" (:func:`cpu_kind`)."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    name, text = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        pass
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith("model name")), name)
    kind = cpu_kind(str(torch.backends.cpu.get_cpu_capability()), text)
    return f"{name} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads; {kind})"


def device_mismatch(profile_device_name: str, here: str) -> str | None:
    """One line saying why a profile measured on ``profile_device_name`` cannot price
    steps run on ``here`` (both as calibration.measure.device_name writes them), or None
    when they are the same kind. CPUs compare by kind (family, model, torch's kernel level,
    bf16 instruction sets), the part after ";": on a 2-core AVX2 EPYC the shipped profile
    priced bf16 steps 1.5-14x too fast (step bias -84%), though both CPUs read "AMD EPYC".
    A CPU profile that records no kind is reported as unknown."""
    if profile_device_name == here:
        return None
    _, sep, kind = profile_device_name.partition(";")
    _, here_sep, here_kind = here.partition(";")
    if not here_sep:  # a GPU: its name is its kind
        return f"the profile was measured on {profile_device_name}, this device is {here}"
    if not sep:
        return (f"the profile does not record its CPU kind ({profile_device_name}); this "
                f"CPU is {here_kind.strip(' )')}: if that differs, calibrate here")
    if kind != here_kind:
        return (f"the profile was measured on another CPU kind ({kind.strip(' )')}) than "
                f"this one ({here_kind.strip(' )')}): calibrate here")
    return None


def measure(spec: ModelSpec, grid: GridConfig, *, num_layers: int | None = None,
            dtype: str = "bf16", device: str = "cpu", threads: int | None = 1,
            budget_s: float = 540.0, seed: int = 0, progress: bool = True,
            points: Sequence[GridPoint] | None = None, timer: str = "auto") -> Measurement:
    """Time the grid (or the given ``points``, which must fit the grid's limits) on a
    random-weight decoder (calibration.torch_model).

    Runs are interleaved: ``grid.warmup`` untimed rounds over every point, then up to
    ``grid.repeats`` timed rounds; each point keeps its fastest run (MeasuredPoint.seconds;
    median and max recorded too). A burst of load from another process then spoils one
    run of many points rather than every run of one. CUDA is synchronised before and
    after each run. ``timer``: the step clock (:func:`resolve_timer`; auto = the thread's
    CPU time on CPU with one thread, else the wall clock). ``threads``: torch CPU threads
    while measuring (restored after; None leaves torch's default). One thread is the
    default because on a shared machine a multi-threaded step slows down up to tenfold
    whenever another process takes a core, a single thread about twofold at worst.
    ``budget_s`` (seconds from the call, model build included): no run starts that its
    point's last run says would overrun; points with at least one timed run are kept.
    Raises ValueError naming num_layers / dtype / device / threads / budget_s / timer when
    invalid; ImportError when torch is missing.
    """
    clock = time.thread_time if resolve_timer(timer, device, threads) == "thread" else None
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    for p in points or ():
        if (p.decode_seqs > grid.max_num_seqs or p.decode_context >= grid.max_context
                or p.chunk_context + p.chunk_tokens > grid.max_context):
            raise ValueError(f"points: {p} does not fit the grid limits {grid}")
    import torch

    from calibration.torch_model import build_decoder

    start = time.perf_counter()
    saved_threads = torch.get_num_threads()
    try:
        if threads is not None and device == "cpu":
            torch.set_num_threads(threads)
        model = build_decoder(spec, num_layers, dtype, device, seed)
        cache = model.new_cache(grid.max_num_seqs + 1, grid.max_context)
        planned = make_grid(grid) if points is None else list(points)
        runs = _rounds(torch, model, cache, planned, grid, start + budget_s, seed, progress,
                       clock or time.perf_counter)
        name = device_name(torch, model.device)
    finally:
        torch.set_num_threads(saved_threads)
    cuda = model.device.type == "cuda"
    done = tuple(MeasuredPoint(p, min(ts), statistics.median(ts), max(ts), len(ts), peak)
                 for p, (ts, peak) in zip(planned, runs, strict=True) if ts)
    memory = {
        "weight_bytes": model.weight_bytes(), "kv_cache_bytes": cache.num_bytes(),
        "peak_bytes": max((m.peak_bytes or 0 for m in done), default=0) if cuda else None,
        "note": ("peak_bytes: torch.cuda.max_memory_allocated over the grid" if cuda else
                 "CPU: weights and KV cache allocated; activation memory not measured"),
    }
    return Measurement(done, grid, len(model.layers), dtype, device, name,
                       str(torch.__version__), memory, time.perf_counter() - start,
                       len(planned), {"name": "torch", "timer": "thread" if clock else "wall",
                                      "threads": threads if device == "cpu" else None})


def _rounds(torch: Any, model: Any, cache: Any, planned: list[GridPoint], grid: GridConfig,
            deadline: float, seed: int, progress: bool,
            clock: Callable[[], float]) -> list[tuple[list[float], int | None]]:
    """Interleaved rounds over the planned points until done or the deadline (a
    perf_counter time); per point: its timed runs (seconds by ``clock``) and CUDA peak
    bytes."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    times: list[list[float]] = [[] for _ in planned]
    last = [0.0] * len(planned)
    peaks: list[int | None] = [None] * len(planned)
    num_rounds = grid.warmup + grid.repeats
    with progress_bar(progress) as bar:
        task = bar.add_task("warm-up", total=num_rounds * len(planned))
        for r in range(num_rounds):
            label = "warm-up" if r < grid.warmup else f"round {r - grid.warmup + 1}"
            for i, p in enumerate(planned):
                if time.perf_counter() + last[i] > deadline:
                    return list(zip(times, peaks, strict=True))
                if cuda:
                    torch.cuda.reset_peak_memory_stats(model.device)
                last[i] = _time_step(model, cache, p, gen, sync, clock)
                if cuda:
                    peak = int(torch.cuda.max_memory_allocated(model.device))
                    peaks[i] = max(peaks[i] or 0, peak)
                if r >= grid.warmup:
                    times[i].append(last[i])
                bar.update(task, advance=1, description=f"{label}/{grid.repeats} {p.region}")
    return list(zip(times, peaks, strict=True))


def _time_step(model: Any, cache: Any, p: GridPoint, gen: Any,
               sync: Callable[[], None] | None, clock: Callable[[], float]) -> float:
    """Seconds of one model.step for point p by ``clock``, contexts reset first (outside
    the timing)."""
    from calibration.torch_model import Chunk

    slot = len(cache.lengths) - 1
    for i in range(p.decode_seqs):
        cache.lengths[i] = p.decode_context
    cache.lengths[slot] = p.chunk_context
    chunks = [Chunk(slot, p.chunk_tokens, p.chunk_sample)] if p.chunk_tokens else []
    if sync is not None:
        sync()
    t0 = clock()
    model.step(cache, range(p.decode_seqs), chunks, gen)
    if sync is not None:
        sync()
    return clock() - t0


def progress_bar(enabled: bool) -> Any:
    """A rich progress bar with elapsed and remaining time (disabled: draws nothing)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                    disable=not enabled)
