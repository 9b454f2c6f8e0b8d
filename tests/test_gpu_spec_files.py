"""GPU spec files in YAML as in JSON, and gemm_efficiency: a GPUSpec field that presets carry
in calibration/data/gpus.json, a spec file may set, and the roofline prices compute at; the
non-torch memory a spec file may set for the KV plan."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from calibration.gpus import get_gpu, list_gpus, load_gpu_spec
from calibration.memory import plan_for
from calibration.roofline import DEFAULT_COMPUTE_EFFICIENCY, RooflineCostModel, gemm_efficiency
from calibration.specs import GIB, get_model
from sim.app.runs.config_file import absolute_paths
from sim.app.runs.runner import RunConfig, prepare
from sim.batch import BatchShape

# H100 SXM's spec-sheet numbers under another name (a spec file gets no preset's figures).
SPEC = {"memory_gib": 80, "memory_bandwidth_gb_s": 3350, "bf16_tensor_dense_tflops": 989.4,
        "fp16_tensor_dense_tflops": 989.4, "fp32_tflops": 67,
        "interconnect_bandwidth_gb_s": 450, "interconnect_latency_us": 10}
YAML = """\
# a lab's H100
memory_gib: 80
memory_bandwidth_gb_s: 3350
bf16_tensor_dense_tflops: 989.4
fp16_tensor_dense_tflops: 989.4
fp32_tflops: 67
interconnect_bandwidth_gb_s: 450
interconnect_latency_us: 10
"""


def write_spec(folder: Path, file: str, **extra: float) -> Path:
    """A spec file of SPEC (and ``extra``) in the format its suffix names."""
    path = folder / file
    if path.suffix == ".json":
        path.write_text(json.dumps({**SPEC, **extra}))
    else:
        path.write_text(YAML + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    return path


def test_yaml_and_yml_spec_files_read_as_the_json_one(tmp_path: Path) -> None:
    specs = [get_gpu(str(write_spec(tmp_path, f"lab-h100{suffix}")))
             for suffix in (".json", ".yaml", ".yml")]
    assert [s.name for s in specs] == ["lab-h100"] * 3  # the file's stem
    assert specs[1].source == f"GPU spec file {tmp_path / 'lab-h100.yaml'}"
    json_spec, yaml_spec, yml_spec = (replace(s, source="") for s in specs)
    assert yaml_spec == json_spec and yml_spec == json_spec
    assert json_spec.memory_bandwidth_bytes_per_s == 3350e9
    assert json_spec.interconnect_latency_s == 10e-6
    upper = tmp_path / "LAB.YML"
    upper.write_text("name: lab-h100\n" + YAML)
    assert replace(load_gpu_spec(upper), source="") == json_spec


def test_gemm_efficiency_from_a_spec_file(tmp_path: Path) -> None:
    plain = get_gpu(str(write_spec(tmp_path, "plain.yaml")))
    tuned = get_gpu(str(write_spec(tmp_path, "tuned.yaml", gemm_efficiency=0.6)))
    assert plain.gemm_efficiency is None and tuned.gemm_efficiency == 0.6
    assert gemm_efficiency(plain) == DEFAULT_COMPUTE_EFFICIENCY == 0.75
    assert gemm_efficiency(tuned) == 0.6
    assert get_gpu(str(write_spec(tmp_path, "t.json", gemm_efficiency=0.6))) == replace(
        tuned, name="t", source=f"GPU spec file {tmp_path / 't.json'}")


def test_gemm_efficiency_prices_a_compute_bound_prefill(tmp_path: Path) -> None:
    # Llama-3.1-8B, one 2,048-token prompt: its linear layers (2 x 6,979,321,856 FLOPs a
    # token: 32 layers of q, k, v, o and the 3 MLP matrices) and its attention (4 x 32
    # layers x 32 heads x 128 x 2048 * 2049 / 2 pairs) are compute-bound at 0.75 and 0.6,
    # so they take 0.75 / 0.6 = 1.25 times as long at 0.6; the LM head's one row and the
    # element-wise work are memory-bound and cost the same.
    model = get_model("llama-3.1-8b")
    tokens, pairs = 2048, 2048 * 2049 // 2
    shape = BatchShape(num_prefill_tokens=tokens, num_prefill_seqs=1,
                       prefill_attention_pairs=pairs, num_sampled_seqs=1)
    flops = 2 * 6_979_321_856 * tokens + 4 * 32 * 32 * 128 * pairs
    compute_s = flops / (989.4e12 * 0.75)

    def price(file: str, **extra: float) -> float:
        gpu = get_gpu(str(write_spec(tmp_path, file, **extra)))
        return RooflineCostModel(model, gpu, step_overhead_s=0.0,
                                 per_seq_overhead_s=0.0).step_time(shape)

    plain, tuned = price("plain.yaml"), price("tuned.yaml", gemm_efficiency=0.6)
    assert tuned - plain == pytest.approx(compute_s * (0.75 / 0.6 - 1.0), rel=1e-9)
    assert 1.2 < tuned / plain < 1.25  # most of the step is compute
    assert price("h100.json") == RooflineCostModel(
        model, get_gpu("h100-sxm"), compute_efficiency=0.75, step_overhead_s=0.0,
        per_seq_overhead_s=0.0).step_time(shape)  # the same numbers as the preset


def test_a_run_on_a_yaml_spec_file_takes_its_gemm_efficiency(tmp_path: Path) -> None:
    path = str(write_spec(tmp_path, "lab.yml", gemm_efficiency=0.6))
    prep = prepare(RunConfig(gpu=path, num_requests=5))
    assert prep.config.roofline_compute_efficiency == 0.6  # config.json records it
    assert absolute_paths(None, None, "chunked", "llama-3.1-8b", path)["gpu"] == path


@pytest.mark.parametrize("value", [0, 1.5, -0.5])
def test_gemm_efficiency_outside_0_1_is_refused(tmp_path: Path, value: float) -> None:
    for file in ("bad.json", "bad.yaml"):
        with pytest.raises(ValueError, match=r"GPUSpec\.gemm_efficiency must be in \(0, 1\]"):
            get_gpu(str(write_spec(tmp_path, file, gemm_efficiency=value)))
    with pytest.raises(ValueError, match="gemm_efficiency"):
        replace(get_gpu("h100-sxm"), gemm_efficiency=value)
    assert replace(get_gpu("h100-sxm"), gemm_efficiency=1.0).gemm_efficiency == 1.0


def test_bad_yaml_files_give_one_line_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("memory_gib: 80\n  memory_bandwidth_gb_s: [3350\n")
    with pytest.raises(ValueError) as err:
        get_gpu(str(broken))
    message = str(err.value)
    assert message.startswith(f"{broken}: cannot read GPU spec: ") and "\n" not in message
    listed = tmp_path / "list.yml"
    listed.write_text("- memory_gib: 80\n")
    with pytest.raises(ValueError, match=re.escape(f"{listed}: a GPU spec file holds one table")):
        get_gpu(str(listed))
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ValueError, match="holds one table"):
        get_gpu(str(tmp_path / "empty.yaml"))
    short = tmp_path / "short.yaml"
    short.write_text("memory_gib: 80\nfp32_tflops: 67\n")
    with pytest.raises(ValueError, match=re.escape(
            f"{short}: missing keys: memory_bandwidth_gb_s, bf16_tensor_dense_tflops, "
            "fp16_tensor_dense_tflops")):
        get_gpu(str(short))


@pytest.mark.parametrize("line", ["gemm_efficiency: true", "gemm_efficiency: high",
                                  "gemm_efficiency: [0.6]", "memory_gib: 2024-01-01"])
def test_a_value_that_is_no_number_is_named_with_its_file(tmp_path: Path, line: str) -> None:
    # YAML reads true as a bool and 2024-01-01 as a date: neither is a figure.
    key = line.split(":")[0]
    path = tmp_path / "lab.yaml"
    path.write_text(YAML.replace("memory_gib: 80\n", "memory_gib: 80\n" if key != "memory_gib"
                                 else "") + line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a number: {key}")):
        get_gpu(str(path))


def test_an_invalid_figure_names_its_file(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "lab.yml", gemm_efficiency=1.5)
    with pytest.raises(ValueError, match=re.escape(f"{path}: GPUSpec.gemm_efficiency")):
        get_gpu(str(path))
    # An infinite size cannot be whole bytes: one line naming the file, no OverflowError.
    for key in ("non_torch_gib", "tp_non_torch_gib", "memory_gib"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(YAML.replace("memory_gib: 80\n", "") + f"{key}: .inf\n"
                        + ("memory_gib: 80\n" if key != "memory_gib" else ""))
        with pytest.raises(ValueError, match=re.escape(f"{path}: ")):
            get_gpu(str(path))


def test_presets_carry_their_measured_gemm_efficiency_with_a_source() -> None:
    measured = {"a100-40gb": 0.70, "a100-80gb": 0.70, "h100-sxm": 0.77, "h100-pcie": 0.77,
                "h200-sxm": 0.77, "rtx-4090": 0.99}
    assert {n: get_gpu(n).gemm_efficiency for n in list_gpus()
            if get_gpu(n).gemm_efficiency is not None} == measured
    assert gemm_efficiency(get_gpu("l40s")) == DEFAULT_COMPUTE_EFFICIENCY
    data = json.loads((Path(__file__).parents[1] / "calibration/data/gpus.json").read_text())
    assert "gemm_efficiency" in data["_readme"]
    for entry in data["gpus"]:
        has_source = bool(entry.get("gemm_efficiency_source"))
        assert has_source == ("gemm_efficiency" in entry), entry["name"]


def test_non_torch_memory_from_a_spec_file_sizes_the_kv_plan(tmp_path: Path) -> None:
    # A lab's H100 whose vLLM logs print 0.3 GiB outside torch alone and 2.0 GiB a GPU at
    # TP 2: the plan deducts those, and without the keys the defaults (0.25 and 0.54 GiB).
    spec = load_gpu_spec(write_spec(tmp_path, "lab.json", non_torch_gib=0.3,
                                    tp_non_torch_gib=2.0))
    plain = load_gpu_spec(write_spec(tmp_path, "plain.json"))
    assert (spec.non_torch_bytes, spec.tp_non_torch_bytes) == (round(0.3 * GIB), 2 * GIB)
    assert (plain.non_torch_bytes, plain.tp_non_torch_bytes) == (None, None)
    model = get_model("llama-3.1-8b")
    plans = {(name, tp): plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16,
                                  tensor_parallel_size=tp).non_torch_bytes
             for name, gpu in (("lab", spec), ("plain", plain)) for tp in (1, 2)}
    assert plans == {("lab", 1): round(0.3 * GIB), ("lab", 2): 2 * GIB,
                     ("plain", 1): round(0.25 * GIB), ("plain", 2): round(0.54 * GIB)}
