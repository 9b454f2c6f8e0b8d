"""The CUDA graphs vLLM captures at start-up and the memory it sets aside for them. Owns
the capture sizes and the CUDA-graph memory estimate that calibration/memory.py takes
from the KV-cache budget.

From vLLM 0.21 the GPU worker measures what capturing the graphs will hold and deducts it
from the KV cache (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, "default since v0.21.0"
in vllm/v1/worker/gpu_worker.py of vLLM 0.32); through 0.20 the graphs came out of the
1 - gpu_memory_utilization headroom. ``--enforce-eager`` captures none, so nothing is
deducted. vLLM measures the estimate by capturing the two largest graphs of each mode
(``profile_cudagraph_memory`` in vllm/v1/worker/gpu_model_runner.py): the first capture,
plus the second's increase for each further graph. servesim does not capture anything, so
it models that measurement: a first-capture constant plus a per-graph cost proportional
to the layers a graph replays, both fitted to the estimates vLLM 0.19 logs on H100s
(CUDA_GRAPH_FIRST_CAPTURE_BYTES's docstring).

Sizes in bytes.
"""

from __future__ import annotations

from calibration.specs import GIB

MIB = 1 << 20

DEFAULT_MAX_CAPTURE_SIZE = 512
"""vLLM's largest default capture size; 1,024 on data-centre Blackwell (compute capability
family 100), BLACKWELL_MAX_CAPTURE_SIZE."""

BLACKWELL_MAX_CAPTURE_SIZE = 1024

BLACKWELL_DATA_CENTRE_GPUS = frozenset({"b200"})
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


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                            max_capture_size: int = DEFAULT_MAX_CAPTURE_SIZE) -> list[int]:
    """The batch sizes (tokens) vLLM captures a piecewise graph for, ascending.

    vLLM 0.32's VllmConfig._set_cudagraph_sizes (vllm/config/vllm.py) without speculative
    decoding: the largest is min(2 x max_num_seqs, max_capture_size, max_num_batched_tokens);
    the list is 1, 2, 4, then every 8 below 256, then every 16 from 256, plus
    max_num_batched_tokens and max_num_seqs where they fit. Llama on an H100 with vLLM's
    defaults (1,024 sequences, 8,192 tokens): 51 sizes, 1 to 512. Raises ValueError naming
    a non-positive argument."""
    for name, value in (("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_capture_size", max_capture_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    largest = min(2 * max_num_seqs, max_capture_size)
    decode_sizes = [max_num_seqs] if max_num_seqs <= largest else []
    largest = min(max_num_batched_tokens, largest)
    sizes = {n for n in (1, 2, 4) if n <= largest}
    sizes.update(range(8, min(largest + 1, 256), 8))
    sizes.update(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    sizes.update(n for n in decode_sizes if n <= max_num_batched_tokens)
    return sorted(sizes)


def max_capture_size(gpu_name: str) -> int:
    """vLLM's largest default capture size on the GPU preset ``gpu_name``."""
    return (BLACKWELL_MAX_CAPTURE_SIZE if gpu_name in BLACKWELL_DATA_CENTRE_GPUS
            else DEFAULT_MAX_CAPTURE_SIZE)


def cudagraph_memory_bytes(num_layers: int, max_num_seqs: int, max_num_batched_tokens: int,
                           max_capture: int = DEFAULT_MAX_CAPTURE_SIZE) -> int:
    """vLLM's CUDA-graph memory estimate for one GPU, the amount it deducts from the KV
    cache (vLLM >= 0.21, without --enforce-eager):

        first + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * num_layers * (P - 1 + F - 1)

    P = len(cudagraph_capture_sizes(...)) piecewise graphs (any batch), F of them no
    larger than max_num_seqs as full graphs (uniform decode batches: vLLM's
    CudagraphDispatcher in vllm/v1/cudagraph_dispatcher.py), first =
    CUDA_GRAPH_FIRST_CAPTURE_BYTES; max_capture: max_capture_size(gpu). Llama-3.1-8B on
    an H100 with vLLM's defaults: 0.31 GiB + 32 x 0.174 MiB x 100 = 0.85 GiB (vLLM 0.19
    logs 0.84). Raises ValueError naming a non-positive argument."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, max_capture)
    num_full = sum(1 for n in sizes if n <= max_num_seqs)
    further = (len(sizes) - 1) + max(num_full - 1, 0)
    return CUDA_GRAPH_FIRST_CAPTURE_BYTES + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * num_layers * further
