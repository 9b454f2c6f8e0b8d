"""The CUDA graphs vLLM captures at start-up and the memory it sets aside for them. Owns
the CUDA-graph settings (CudaGraphConfig: vLLM's cudagraph_mode, cudagraph_capture_sizes,
max_cudagraph_capture_size, optimization level, compilation mode and performance mode, and
the mode they settle), the capture sizes, the graphs each mode captures, and the
CUDA-graph memory estimate that calibration/memory.py takes from the KV-cache budget.

From vLLM 0.21 the GPU worker measures what capturing the graphs will hold and deducts it
from the KV cache (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, "default since v0.21.0"
in vllm/v1/worker/gpu_worker.py of vLLM 0.32); through 0.20 the graphs came out of the
1 - gpu_memory_utilization headroom. ``--enforce-eager`` captures none, so nothing is
deducted. vLLM measures the estimate by capturing the two largest graphs of each mode
(``profile_cudagraph_memory`` in vllm/v1/worker/gpu_model_runner.py): the first capture,
plus the second's increase for each further graph. servesim does not capture anything, so
it models that measurement: a first-capture constant plus a per-graph cost proportional
to the layers a graph replays, both fitted to the estimates vLLM 0.19 logs on H100s
(CUDA_GRAPH_FIRST_CAPTURE_BYTES's docstring). The same first-capture constant stands
for a mode that captures one kind of graph only (PIECEWISE, FULL, FULL_DECODE_ONLY): vLLM
0.32 counts the largest of the modes' first captures once, not their sum.

Sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.attention_backends import COMPUTE_CAPABILITY_MAJOR
from calibration.specs import GIB

MIB = 1 << 20

DEFAULT_MAX_CAPTURE_SIZE = 512
"""vLLM's largest default capture size; 1,024 on data-centre Blackwell (compute capability
family 100), BLACKWELL_MAX_CAPTURE_SIZE."""

BLACKWELL_MAX_CAPTURE_SIZE = 1024

BLACKWELL_DATA_CENTRE_GPUS = frozenset(
    name for name, major in COMPUTE_CAPABILITY_MAJOR.items() if major == 10)
"""GPU presets of compute capability 10.x, where vLLM's largest capture size is 1,024."""

CUDA_GRAPH_FIRST_CAPTURE_BYTES = round(0.31 * GIB)
"""The first-capture term (FULL_AND_PIECEWISE, vLLM's default mode, measures a first capture
for each mode; the fit lumps them into one constant).

Fitted with CUDA_GRAPH_BYTES_PER_GRAPH_LAYER by least squares to the "Estimated CUDA graph
memory: X GiB total" line of 42 vLLM 0.19.0 start-up logs on an H100 80GB (llm-d-planner,
accuracy/results/v0.19.0/logs at commit d3121e05: 2B to 72B models, dense and MoE, TP 1-4,
PP 1-4): median absolute error 0.10 GiB. vLLM's own estimate rests on one sample per mode
and scatters as much (Llama-3.1-8B: 0.84 GiB at TP 1, 1.69 at TP 2, 0.57 at TP 4). Every
fitted log has 51 graphs of each mode, so the fit separates layers, not graph counts: the
per-graph scaling to other counts is vLLM's rule (first capture + (n - 1) x the second's
increase), the per-layer cost an assumption checked only by the two vLLM 0.28 rows of
docs/fidelity.md (128 sequences: 35 piecewise and 19 full graphs)."""

CUDA_GRAPH_BYTES_PER_GRAPH_LAYER = round(0.174 * MIB)
"""Memory each graph after a mode's first holds, per decoder layer it replays (fitted with
CUDA_GRAPH_FIRST_CAPTURE_BYTES): Llama-3.1-8B's 32 layers give 5.6 MiB a graph against
the 6 MiB vLLM measures, Llama-3.3-70B's 80 give 13.9 MiB against 12-20."""


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM's CUDAGraphMode names (vllm/config/compilation.py, vLLM 0.32), which it also reads
as the integers 0, 1, 2 of the first three (never as text: cudagraph_mode_name)."""

DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"
"""vLLM's mode at its default optimization level, -O2 (OPTIMIZATION_LEVEL_02 in
vllm/config/vllm.py)."""

DEFAULT_OPTIMIZATION_LEVEL = 2
"""vLLM's default optimization level, -O2 (VllmConfig.optimization_level)."""

LEVEL_CUDAGRAPH_MODES = ("NONE", "PIECEWISE", DEFAULT_CUDAGRAPH_MODE, DEFAULT_CUDAGRAPH_MODE)
"""The cudagraph_mode each optimization level -O0 .. -O3 sets where none is given
(OPTIMIZATION_LEVEL_00 .. _03 in vLLM 0.32's vllm/config/vllm.py)."""

COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
"""vLLM's CompilationMode names by value 0-3 (vllm/config/compilation.py); VLLM_COMPILE
is the one that compiles the model piecewise."""

PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
"""vLLM 0.32's performance_mode values (PerformanceMode in vllm/config/vllm.py), the
first its default: interactivity captures every size 1-32 (_set_cudagraph_sizes),
throughput doubles the default batch limits (sim/app/runs/defaults.py)."""


def cudagraph_mode_name(value: object, field: str = "cudagraph_mode") -> str:
    """A cudagraph_mode as vLLM 0.32 reads one (vllm/config/compilation.py): text by
    name only, in any case (validate_cudagraph_mode_before: CUDAGraphMode[value.upper()],
    so "1" is refused), an integer by CUDAGraphMode's value, 0, 1 or 2 (pydantic's enum
    validation). Raises ValueError naming ``field`` otherwise."""
    return _enum_name(value, CUDAGRAPH_MODES, field, 2, "0, 1 or 2")


def compilation_mode_name(value: object, field: str = "compilation_mode") -> str:
    """A compilation mode (compilation_config.mode) as vLLM 0.32 reads one
    (CompilationConfig.validate_mode_before): text by name only, in any case ("3" is
    refused), an integer by its value 0-3 (CompilationMode, an IntEnum). Raises
    ValueError naming ``field`` otherwise."""
    return _enum_name(value, COMPILATION_MODES, field, 3, "0-3")


def _enum_name(value: object, names: tuple[str, ...], field: str, max_int: int,
               integers: str) -> str:
    """``value`` as one of ``names``: a name in any case, or an integer 0..``max_int``
    indexing them (not a bool, not digit text). Raises ValueError naming ``field``."""
    if isinstance(value, str) and value.upper() in names:
        return value.upper()
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= max_int:
        return names[value]
    raise ValueError(f"{field} must be one of {', '.join(names)} or the integer {integers}, "
                     f"got {value!r}")


@dataclass(frozen=True, slots=True)
class CudaGraphConfig:
    """What decides the CUDA graphs vLLM captures, under vLLM's names, as given (None:
    vLLM's default): ``cudagraph_mode`` (a CUDAGRAPH_MODES name; None: the optimization
    level's), ``cudagraph_capture_sizes`` (batch sizes in tokens; None: vLLM's own
    list), ``max_cudagraph_capture_size`` (None: vLLM's ceiling), ``optimization_level``
    (0-3; None: -O2), ``compilation_mode`` (a COMPILATION_MODES name, compilation_config's
    ``mode``; None: VLLM_COMPILE above -O0, else NONE), ``performance_mode`` (a
    PERFORMANCE_MODES value) and ``enforce_eager``. ``mode`` is the cudagraph_mode they
    settle. Raises ValueError naming the field for a value vLLM does not take, and, as
    vLLM asserts only when it captures graphs (mode not NONE; VllmConfig.
    _set_cudagraph_sizes), for an empty cudagraph_capture_sizes or a maximum below 1;
    servesim also refuses sizes below 1."""

    cudagraph_mode: str | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    optimization_level: int | None = None
    compilation_mode: str | None = None
    performance_mode: str = PERFORMANCE_MODES[0]
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.cudagraph_mode is not None:
            object.__setattr__(self, "cudagraph_mode", cudagraph_mode_name(self.cudagraph_mode))
        if self.compilation_mode is not None:
            object.__setattr__(self, "compilation_mode",
                               compilation_mode_name(self.compilation_mode))
        level = self.optimization_level
        if level is not None and (isinstance(level, bool) or level not in range(4)):
            raise ValueError(f"optimization_level must be 0, 1, 2 or 3, got {level!r}")
        if self.performance_mode not in PERFORMANCE_MODES:
            raise ValueError(f"performance_mode must be one of {', '.join(PERFORMANCE_MODES)}, "
                             f"got {self.performance_mode!r}")
        sizes, top = self.cudagraph_capture_sizes, self.max_cudagraph_capture_size
        if sizes is not None:
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
                raise ValueError("cudagraph_capture_sizes must be a list of integers >= 1, "
                                 f"got {list(sizes)!r}")
            object.__setattr__(self, "cudagraph_capture_sizes", tuple(sizes))
        if top is not None and (isinstance(top, bool) or not isinstance(top, int)):
            raise ValueError(f"max_cudagraph_capture_size must be an integer, got {top!r}")
        if self.mode != "NONE":
            self._check_capture_settings()

    def _check_capture_settings(self) -> None:
        """vLLM's assertions when it captures graphs (_set_cudagraph_sizes)."""
        if self.cudagraph_capture_sizes == ():
            raise ValueError("cudagraph_capture_sizes must hold at least one size when vLLM "
                             f"captures CUDA graphs (cudagraph_mode {self.mode})")
        top = self.max_cudagraph_capture_size
        if top is not None and top < 1:
            raise ValueError(f"max_cudagraph_capture_size must be >= 1 when vLLM captures "
                             f"CUDA graphs (cudagraph_mode {self.mode}), got {top}")

    @property
    def compilation(self) -> str:
        """The compilation mode vLLM runs with: the given one, else VLLM_COMPILE above
        -O0 and NONE at -O0 (VllmConfig.__post_init__)."""
        if self.compilation_mode is not None:
            return self.compilation_mode
        level = DEFAULT_OPTIMIZATION_LEVEL if self.optimization_level is None \
            else self.optimization_level
        return "VLLM_COMPILE" if level > 0 else "NONE"

    @property
    def mode(self) -> str:
        """The cudagraph_mode vLLM 0.32 settles at start-up (VllmConfig.__post_init__,
        vllm/config/vllm.py), for a decoder: NONE with enforce_eager; the given mode,
        else the optimization level's (LEVEL_CUDAGRAPH_MODES); and a mode with piecewise
        graphs under any compilation mode but VLLM_COMPILE loses them
        (_normalize_piecewise_cudagraph_mode, CUDAGraphMode.without_piecewise: PIECEWISE
        -> NONE, FULL_AND_PIECEWISE -> FULL_DECODE_ONLY). -O0 thus captures nothing, -O1
        piecewise graphs only. Not modelled: vLLM's breakable CUDA graphs, on by default
        for a few architectures only (VLLM_USE_BREAKABLE_CUDAGRAPH), which keep piecewise
        graphs without compilation. The attention backend may still change FULL when
        the model runs (runtime_mode)."""
        if self.enforce_eager:
            return "NONE"
        level = DEFAULT_OPTIMIZATION_LEVEL if self.optimization_level is None \
            else self.optimization_level
        mode = self.cudagraph_mode or LEVEL_CUDAGRAPH_MODES[level]
        if self.compilation != "VLLM_COMPILE" and "PIECEWISE" in mode:
            mode = "FULL_DECODE_ONLY" if mode == "FULL_AND_PIECEWISE" else "NONE"
        return mode

    def runtime_mode(self, full_mixed_batches: bool | None) -> str:
        """``mode`` as the GPU model runner leaves it once it knows the attention backend
        (CompilationConfig.resolve_cudagraph_mode_and_sizes, vllm/config/compilation.py):
        FULL, whose mixed batches run one full graph, needs a backend with
        AttentionCGSupport.ALWAYS (``full_mixed_batches``, full_cudagraph_support); on
        any other it becomes FULL_AND_PIECEWISE where the attention ops split the
        compiled graph (VLLM_COMPILE's default splitting_ops, set_splitting_ops_for_v1),
        else FULL_DECODE_ONLY. ``full_mixed_batches`` None (a GPU of unknown backend):
        FULL as given."""
        mode = self.mode
        if mode != "FULL" or full_mixed_batches is not False:
            return mode
        return "FULL_AND_PIECEWISE" if self.compilation == "VLLM_COMPILE" else "FULL_DECODE_ONLY"


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                            max_capture_size: int = DEFAULT_MAX_CAPTURE_SIZE,
                            config: CudaGraphConfig | None = None) -> list[int]:
    """The batch sizes (tokens) vLLM captures graphs for, ascending.

    vLLM 0.32's VllmConfig._set_cudagraph_sizes (vllm/config/vllm.py) without speculative
    decoding. By default the largest is min(2 x max_num_seqs, max_capture_size,
    max_num_batched_tokens); the list is 1, 2, 4 (with performance_mode interactivity:
    every size from 1 to min(largest, 32)), then every 8 below 256, then every 16 from
    256, plus max_num_batched_tokens and max_num_seqs where they fit. Llama on an H100
    with vLLM's defaults (1,024 sequences, 8,192 tokens): 51 sizes, 1 to 512 (76 with
    interactivity). ``config`` (None: vLLM's defaults) may set vLLM's
    max_cudagraph_capture_size, which replaces min(2 x max_num_seqs, max_capture_size)
    and adds no max_num_seqs size, or cudagraph_capture_sizes, an explicit list kept up
    to max_num_batched_tokens (then a max_cudagraph_capture_size given too must be its
    largest kept size, as vLLM checks). Raises ValueError naming a non-positive argument
    or an inconsistent maximum."""
    for name, value in (("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_capture_size", max_capture_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    config = config or CudaGraphConfig()
    given_max = config.max_cudagraph_capture_size
    if config.cudagraph_capture_sizes is not None:
        return _explicit_sizes(config.cudagraph_capture_sizes, given_max,
                               max_num_batched_tokens)
    if given_max is None:
        largest = min(2 * max_num_seqs, max_capture_size)
        decode_sizes = [max_num_seqs] if max_num_seqs <= largest else []
    else:
        largest, decode_sizes = given_max, []
    largest = min(max_num_batched_tokens, largest)
    small = (range(1, min(largest, 32) + 1) if config.performance_mode == "interactivity"
             else (1, 2, 4))
    sizes = {n for n in small if n <= largest}
    sizes.update(range(8, min(largest + 1, 256), 8))
    sizes.update(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    sizes.update(n for n in decode_sizes if n <= max_num_batched_tokens)
    return sorted(sizes)


def _explicit_sizes(given: tuple[int, ...], given_max: int | None,
                    max_num_batched_tokens: int) -> list[int]:
    """An explicit cudagraph_capture_sizes as vLLM 0.32 keeps it (_set_cudagraph_sizes):
    deduplicated, sorted, those above max_num_batched_tokens dropped; a
    max_cudagraph_capture_size given with it must equal the largest kept (ValueError in
    vLLM's words otherwise)."""
    sizes = sorted({n for n in given if n <= max_num_batched_tokens})
    largest = sizes[-1] if sizes else 0
    if given_max is not None and given_max != largest:
        raise ValueError(f"max_cudagraph_capture_size: customized max_cudagraph_capture_size"
                         f"(={given_max}) should be consistent with the max value of "
                         f"cudagraph_capture_sizes(={largest})")
    return sizes


def cudagraph_counts(mode: str, sizes: list[int], max_num_seqs: int) -> tuple[int, int]:
    """(piecewise, full) graphs vLLM captures in cudagraph_mode ``mode`` (as the model
    runner leaves it: CudaGraphConfig.runtime_mode) over the capture ``sizes``, without
    LoRA or speculative decoding: CudagraphDispatcher.initialize_cudagraph_keys
    (vllm/v1/cudagraph_dispatcher.py, vLLM 0.32) gives one key per size to the mode's
    mixed-batch graphs (CUDAGraphMode.mixed_mode: PIECEWISE for PIECEWISE and
    FULL_AND_PIECEWISE, FULL for FULL, none for FULL_DECODE_ONLY), and for the modes
    with a separate decode routine (FULL_DECODE_ONLY, FULL_AND_PIECEWISE) one full graph
    per size up to max_num_seqs (uniform decode batches); NONE captures none. With 51
    sizes and 1,024 sequences: PIECEWISE (51, 0), FULL (0, 51), FULL_DECODE_ONLY
    (0, 51), FULL_AND_PIECEWISE (51, 51)."""
    mode = cudagraph_mode_name(mode)
    decode = sum(1 for n in sizes if n <= max_num_seqs)
    return {"NONE": (0, 0), "PIECEWISE": (len(sizes), 0), "FULL": (0, len(sizes)),
            "FULL_DECODE_ONLY": (0, decode),
            "FULL_AND_PIECEWISE": (len(sizes), decode)}[mode]


def max_capture_size(gpu_name: str) -> int:
    """vLLM's largest default capture size on the GPU preset ``gpu_name``."""
    return (BLACKWELL_MAX_CAPTURE_SIZE if gpu_name in BLACKWELL_DATA_CENTRE_GPUS
            else DEFAULT_MAX_CAPTURE_SIZE)


def cudagraph_memory_bytes(num_layers: int, max_num_seqs: int, max_num_batched_tokens: int,
                           max_capture: int = DEFAULT_MAX_CAPTURE_SIZE,
                           config: CudaGraphConfig | None = None,
                           full_mixed_batches: bool | None = None) -> int:
    """vLLM's CUDA-graph memory estimate for one GPU, the amount it deducts from the KV
    cache (vLLM >= 0.21, without --enforce-eager):

        first + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * num_layers * (max(P - 1, 0) + max(F - 1, 0))

    (P, F) = cudagraph_counts(mode, cudagraph_capture_sizes(...), max_num_seqs), the
    piecewise and full graphs of the mode the model runner captures
    (config.runtime_mode(full_mixed_batches), full_cudagraph_support's answer for the
    GPU; None keeps FULL); first = CUDA_GRAPH_FIRST_CAPTURE_BYTES; 0 when no graph is
    captured. vLLM 0.32's profile_cudagraph_memory (vllm/v1/worker/gpu_model_runner.py)
    adds, per mode, (n - 1) x the second capture's increase to the largest first capture
    of the modes (the graphs share one pool), and returns 0 with no graph to capture.
    ``config``: the CUDA-graph settings (None: vLLM's defaults, FULL_AND_PIECEWISE);
    max_capture: max_capture_size(gpu). Llama-3.1-8B on an H100 with vLLM's defaults:
    0.31 GiB + 32 x 0.174 MiB x 100 = 0.85 GiB (vLLM 0.19 logs 0.84). Raises ValueError
    naming a non-positive argument."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    config = config or CudaGraphConfig()
    mode = config.runtime_mode(full_mixed_batches)
    if mode == "NONE":  # vLLM sets no capture sizes then
        return 0
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, max_capture, config)
    piecewise, full = cudagraph_counts(mode, sizes, max_num_seqs)
    if piecewise + full == 0:
        return 0
    further = max(piecewise - 1, 0) + max(full - 1, 0)
    return CUDA_GRAPH_FIRST_CAPTURE_BYTES + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * num_layers * further
