"""Timing steps of a real vLLM V1 engine: the parent side of ``servesim calibrate --engine
vllm`` (no vLLM here).

Owns :func:`measure_vllm`: it writes the model's config.json (a preset's, or the user's
file) into a temporary folder, starts calibration/vllm_driver.py in the Python that has
vLLM (``--python``), sends it the request (engine settings and the grid of
calibration/grid.py), reads its JSON lines, and returns the same
:class:`calibration.measure.Measurement` the torch engine yields, so the fit, the
held-out gates and the profile file are shared. It also owns the protocol's reading
(:func:`read_lines`, :func:`points_from_steps`) and :class:`DriverError`: every way the
child can fail (it cannot start, exits non-zero, prints what is not a protocol line, lacks
vLLM, reports an error) becomes one line.

The driver times the grid in interleaved rounds (``grid.warmup`` untimed, then
``grid.repeats``), one step per point a round; each point keeps its fastest timed step
(MeasuredPoint.seconds), median and max over the rounds (a fit on the thread clock takes
the median: calibration.fit.default_statistic). The engine record keeps vLLM's start-up
facts and each point's per-phase split (schedule, model forward, LM head, sampling,
update, the rest: output processing), in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from calibration.grid import REGIONS, GridConfig, GridPoint, MeasuredPoint, make_grid
from calibration.measure import Measurement, resolve_timer
from calibration.specs import DTYPE_BYTES, ModelSpec
from sim.batch import BatchShape

DRIVER = Path(__file__).with_name("vllm_driver.py")
PROTOCOL = 1
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM"}
"""vLLM architecture of each model family a preset can name (by its name's prefix)."""
TOP_PHASES = ("schedule", "execute_model", "sample_tokens", "update_from_output")


class DriverError(RuntimeError):
    """The vLLM driver failed; the message is one line saying how."""


@dataclasses.dataclass(frozen=True, slots=True)
class VllmSettings:
    """How the engine is started. python: the interpreter that has vLLM. config: the
    model's Hugging Face config.json (None: built from the preset spec). threads: OpenMP
    threads on CPU (None: vLLM's default). block_size: None = vLLM's default for the
    device (128 on CPU). fake: coefficients for the driver's fake engine (tests)."""

    python: str = sys.executable
    config: Path | None = None
    threads: int | None = 1
    block_size: int | None = None
    enforce_eager: bool = True
    fake: dict[str, float] | None = None


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A Hugging Face config.json for a preset spec (vLLM needs one; weights are dummy).
    Raises ValueError when the spec's family is not one vLLM is told here (use --config)."""
    family = next((f for f in ARCHITECTURES if spec.name.lower().startswith(f)), None)
    if family is None:
        raise ValueError(f"model {spec.name!r}: no vLLM architecture known for it; give "
                         "its config.json with --config")
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]], "model_type": family,
        "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings, "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    if spec.num_experts > 1:
        config.update(num_local_experts=spec.num_experts,
                      num_experts_per_tok=spec.num_experts_per_tok)
    return config


def build_request(spec: ModelSpec, grid: GridConfig, settings: VllmSettings, *,
                  model_dir: str, num_layers: int | None, dtype: str, device: str,
                  timer: str, budget_s: float, seed: int) -> dict[str, Any]:
    """The driver's request. On CPU the KV cache holds four times every sequence the
    grid needs at once, so the prefix cache keeps earlier prompts (the driver reuses
    them); on CUDA vLLM sizes it (gpu_memory_utilization)."""
    layers = num_layers or spec.num_layers
    max_model_len = grid.max_context + 2  # a chunk that does not sample has a token left
    per_token = dataclasses.replace(spec, num_layers=layers).kv_bytes_per_token(
        DTYPE_BYTES[dtype])
    return {"protocol": PROTOCOL, "engine": "fake" if settings.fake else "vllm",
            "model_dir": model_dir, "num_layers": num_layers, "dtype": dtype,
            "device": device, "block_size": settings.block_size,
            "max_num_seqs": grid.max_num_seqs,
            "max_num_batched_tokens": grid.max_num_batched_tokens,
            "max_model_len": max_model_len,
            "kv_cache_memory_bytes": (4 * (grid.max_num_seqs + 1) * max_model_len * per_token
                                      if device == "cpu" else None),
            "enforce_eager": settings.enforce_eager, "seed": seed,
            "threads": settings.threads if device == "cpu" else None, "timer": timer,
            "vocab_size": spec.vocab_size, "warmup": grid.warmup, "repeats": grid.repeats,
            "budget_s": budget_s, "fake": {"coefficients": settings.fake or {}},
            "points": [dataclasses.asdict(p) for p in make_grid(grid)]}


def read_lines(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The driver's records, one per line; DriverError naming the line when one is not a
    protocol record (a JSON object with a known ``kind``), or when it reports an error."""
    for number, text in enumerate(lines, 1):
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or record.get("kind") not in (
                "start", "step", "skip", "reject", "end", "error"):
            raise DriverError(f"line {number} of its output is not a protocol record: "
                              f"{text.strip()[:80]!r} (is --python a Python interpreter?)")
        if record["kind"] == "error":
            raise DriverError(str(record.get("message", "no message")))
        yield record


def _grid_point(step: dict[str, Any], planned: GridPoint) -> GridPoint:
    """The grid point a step line ran (its own decode context); DriverError when the
    line's shape is not that point's shape."""
    try:
        shape = BatchShape(**{f: int(step["shape"][f]) for f in BatchShape.__dataclass_fields__})
        point = dataclasses.replace(planned, decode_context=int(step["decode_context"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DriverError(f"malformed step record for {planned.region} point "
                          f"{planned.index}: {exc}") from None
    if point.shape != shape:
        raise DriverError(f"the step run for {planned.region} point {planned.index} has "
                          f"shape {shape}, not the point's {point.shape}")
    return point


def points_from_steps(steps: list[dict[str, Any]],
                      planned: list[GridPoint]) -> tuple[MeasuredPoint, ...]:
    """One MeasuredPoint per planned point with timed (not warm-up) steps, in grid order:
    the fastest repeat's seconds and shape; median and max over the repeats."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for s in steps:
        if not s.get("warmup"):
            runs.setdefault((str(s.get("region")), int(s.get("index", -1))), []).append(s)
    known = {(p.region, p.index) for p in planned}
    stray = sorted(set(runs) - known)
    if stray:
        raise DriverError(f"step records for points not in the grid: {stray[:3]}")
    out = []
    for p in planned:
        mine = runs.get((p.region, p.index))
        if not mine:
            continue
        secs = sorted(float(s["seconds"]) for s in mine)
        if not secs[0] > 0:
            raise DriverError(f"{p.region} point {p.index}: a step of {secs[0]} s")
        best = min(mine, key=lambda s: float(s["seconds"]))
        out.append(MeasuredPoint(_grid_point(best, p), secs[0], statistics.median(secs),
                                 secs[-1], len(secs)))
    return tuple(out)


def phase_split(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured point, the fastest repeat's seconds by phase (timer's clock): the
    EngineCore phases, the model forward and LM head inside execute_model, and
    ``other`` (engine.step() outside the phases: output processing)."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for s in steps:
        key = (s["region"], s["index"])
        if not s.get("warmup") and (key not in best or s["seconds"] < best[key]["seconds"]):
            best[key] = s
    rows = []
    for (region, index), s in sorted(best.items(), key=lambda kv: (
            REGIONS.index(kv[0][0]), kv[0][1])):
        phases = {k: round(float(v), 7) for k, v in s.get("phases", {}).items()}
        other = float(s["seconds"]) - sum(phases.get(k, 0.0) for k in TOP_PHASES)
        rows.append({"region": region, "index": index, "seconds": round(s["seconds"], 7),
                     **phases, "other": round(other, 7)})
    return rows


def run_driver(python: str, request: dict[str, Any],
               on_record: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Run the driver in ``python`` on ``request``; its records, each also handed to
    ``on_record`` as it arrives. Its stderr (vLLM's log) is kept in a temporary file,
    whose last line explains a child that dies. Raises DriverError (one line, naming
    ``python``) on any failure; the child is killed if still running."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        try:
            proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, text=True,
                                    encoding="utf-8")
        except OSError as exc:
            raise DriverError(f"cannot run --python {python}: {exc.strerror or exc}") from None
        try:
            return _talk(proc, request, on_record, log)
        except DriverError as exc:
            raise DriverError(f"vLLM driver ({python}): {exc}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _talk(proc: subprocess.Popen[str], request: dict[str, Any],
          on_record: Callable[[dict[str, Any]], None], log: IO[str]) -> list[dict[str, Any]]:
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: its exit code and log say why, below
    records = []
    for record in read_lines(proc.stdout):
        records.append(record)
        on_record(record)
    code = proc.wait()
    if code != 0:
        log.seek(0)
        tail = [ln.strip() for ln in log.read().splitlines() if ln.strip()]
        raise DriverError(f"exited with code {code}" + (f": {tail[-1][:200]}" if tail else ""))
    if not records or records[0]["kind"] != "start" or records[-1]["kind"] != "end":
        raise DriverError("its output lacks the start or end record")
    return records


def _check(spec: ModelSpec, num_layers: int | None, dtype: str, device: str,
           budget_s: float) -> None:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {list(DTYPE_BYTES)}, got {dtype!r}")
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        raise ValueError(f"device must be cpu or cuda[:N], got {device!r}")
    if num_layers is not None and not 1 <= num_layers <= spec.num_layers:
        raise ValueError(f"num_layers must be in 1..{spec.num_layers}, got {num_layers}")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")


def measure_vllm(spec: ModelSpec, grid: GridConfig, settings: VllmSettings, *,
                 num_layers: int | None = None, dtype: str = "bf16", device: str = "cpu",
                 timer: str = "auto", budget_s: float = 540.0, seed: int = 0,
                 progress: bool = True) -> Measurement:
    """Time the grid on a real vLLM engine (dummy weights; ``num_layers`` overrides the
    config's layer count) in a child process; see the module docstring. ``budget_s``:
    seconds from the call, engine start-up included; the driver starts no point that the
    last of its region says would overrun. Raises ValueError naming dtype / device /
    num_layers / budget_s / timer when invalid; DriverError when the driver fails."""
    _check(spec, num_layers, dtype, device, budget_s)
    clock = resolve_timer(timer, device, settings.threads if device == "cpu" else None)
    planned = make_grid(grid)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="servesim-vllm-") as folder:
        config = (json.loads(settings.config.read_text(encoding="utf-8"))
                  if settings.config is not None else hf_config(spec))
        (Path(folder) / "config.json").write_text(json.dumps(config), encoding="utf-8")
        request = build_request(spec, grid, settings, model_dir=folder,
                                num_layers=num_layers, dtype=dtype, device=device,
                                timer=clock, budget_s=budget_s, seed=seed)
        from calibration.measure import progress_bar

        with progress_bar(progress) as bar:
            task = bar.add_task("starting the vLLM engine",
                                total=len(planned) * (grid.warmup + grid.repeats))
            records = run_driver(settings.python, request, _advance(bar, task, grid))
    steps = [r for r in records if r["kind"] == "step"]
    facts = {k: v for k, v in records[0].items() if k not in ("kind", "engine")}
    layers = int(facts.get("num_layers") or num_layers or spec.num_layers)
    engine = {"name": records[0].get("engine"), "timer": clock, "python": settings.python,
              **facts,
              "stopped_by_budget": bool(records[-1].get("stopped_by_budget")),
              "skipped": [f"{r['region']} {r['index']} round {r.get('repeat')}: "
                          f"{r['reason']}" for r in records if r["kind"] == "skip"],
              "phases": phase_split(steps)}
    memory = {"weight_bytes": dataclasses.replace(spec, num_layers=layers).weight_bytes(
                  DTYPE_BYTES[dtype]),
              "kv_cache_bytes": request["kv_cache_memory_bytes"], "peak_bytes": None,
              "note": "vLLM engine: weights (dummy) from the spec; kv_cache_bytes given to "
                      "vLLM (kv_cache_memory_bytes), its blocks in engine.num_gpu_blocks"}
    return Measurement(points_from_steps(steps, planned), grid, layers, dtype,
                       device.split(":")[0], with_cpu_kind(str(facts.get("device_name")),
                                                           facts.get("cpu_capability")),
                       str(facts.get("torch_version")), memory,
                       time.perf_counter() - began, len(planned), engine)


def with_cpu_kind(name: str, capability: str | None) -> str:
    """The child's CPU name "MODEL (N cores, T torch threads)" with this machine's CPU kind
    (calibration.measure.cpu_kind, from the child's torch kernel level and /proc/cpuinfo)
    added as the torch engine writes it; a GPU name or a name without the child's
    capability is returned as it is."""
    from calibration.measure import cpu_kind

    if capability is None or not name.endswith(")"):
        return name
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        text = ""
    return f"{name[:-1]}; {cpu_kind(capability, text)})"


def _advance(bar: Any, task: Any, grid: GridConfig) -> Callable[[dict[str, Any]], None]:
    """The progress bar's record handler: one step or skip record per point a round."""

    def on_record(r: dict[str, Any]) -> None:
        if r["kind"] == "start":
            bar.update(task, description=f"vLLM {r.get('vllm_version')} started")
        elif r["kind"] in ("step", "skip"):
            rounds = f"round {r.get('repeat', 0) + 1}/{grid.warmup + grid.repeats}"
            bar.update(task, advance=1, description=f"{rounds} {r['region']}")

    return on_record
