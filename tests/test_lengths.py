"""Length samplers: ranges, fits, joint resampling, determinism."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from scenarios.lengths import Empirical, Fixed, Independent, InOrder, LogNormal, Uniform
from scenarios.workload import Workload

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def make_rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed() -> None:
    values = Fixed(7).sample(5, make_rng())
    assert values.dtype == np.int64
    np.testing.assert_array_equal(values, [7] * 5)
    with pytest.raises(ValueError, match="value"):
        Fixed(0)


def test_uniform_is_inclusive_and_in_range() -> None:
    values = Uniform(3, 5).sample(2000, make_rng())
    assert values.dtype == np.int64
    assert set(values.tolist()) == {3, 4, 5}
    with pytest.raises(ValueError, match="low"):
        Uniform(0, 5)
    with pytest.raises(ValueError, match="high"):
        Uniform(5, 4)


def test_lognormal_from_mean_median_matches_the_fit() -> None:
    dist = LogNormal.from_mean_median(mean=211.1, median=129)
    assert dist.sigma == pytest.approx(math.sqrt(2 * math.log(211.1 / 129)))
    values = dist.sample(200_000, make_rng(1))
    assert values.dtype == np.int64 and values.min() >= 1
    assert np.median(values) == pytest.approx(129, rel=0.02)
    assert values.mean() == pytest.approx(211.1, rel=0.02)


def test_lognormal_clips_to_bounds() -> None:
    values = LogNormal(median=100, sigma=2.0, min_len=10, max_len=300).sample(5000, make_rng())
    assert values.min() == 10 and values.max() == 300


def test_lognormal_validation() -> None:
    with pytest.raises(ValueError, match="median"):
        LogNormal(median=0, sigma=1.0)
    with pytest.raises(ValueError, match="sigma"):
        LogNormal(median=10, sigma=-1.0)
    with pytest.raises(ValueError, match="max_len"):
        LogNormal(median=10, sigma=1.0, min_len=5, max_len=4)
    with pytest.raises(ValueError, match="mean"):
        LogNormal.from_mean_median(mean=5, median=10)


def test_independent_is_deterministic_for_a_seed() -> None:
    model = Independent(LogNormal(1000, 0.5), Uniform(1, 50))
    a = model.sample(100, make_rng(9))
    b = model.sample(100, make_rng(9))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_empirical_resamples_pairs_jointly() -> None:
    model = Empirical(num_prompt_tokens=np.array([10, 20, 30]), output_len=np.array([1, 2, 3]))
    prompt, output = model.sample(1000, make_rng())
    np.testing.assert_array_equal(prompt, output * 10)
    assert set(output.tolist()) == {1, 2, 3}


def test_empirical_rejects_bad_data() -> None:
    with pytest.raises(ValueError, match=r"output_len\[1\]"):
        Empirical(num_prompt_tokens=np.array([10, 20]), output_len=np.array([1, 0]))
    with pytest.raises(ValueError, match="equal-length"):
        Empirical(num_prompt_tokens=np.array([10, 20]), output_len=np.array([1]))


def test_empirical_from_length_csv(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                    "100,5,105,20.0\n200,7,207,28.57\n")
    model = Empirical.from_file(path)
    np.testing.assert_array_equal(model.num_prompt_tokens, [100, 200])
    np.testing.assert_array_equal(model.output_len, [5, 7])


def test_empirical_from_length_csv_names_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n100,5\n0,7\n")
    message = "lengths.csv line 3: num_prefill_tokens 0 must be >= 1"
    with pytest.raises(ValueError, match=re.escape(message)):
        Empirical.from_file(path)


def test_empirical_from_workload() -> None:
    workload = Workload.from_arrays([0.0, 1.0], [5, 6], [2, 3])
    model = Empirical.from_workload(workload)
    np.testing.assert_array_equal(model.num_prompt_tokens, [5, 6])


@pytest.mark.parametrize(
    ("name", "rows"),
    [("sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30_731),
     ("vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28_257),
     ("AzureLLMInferenceTrace_conv.csv", 19_366)],
)
def test_empirical_from_shared_files(name: str, rows: int) -> None:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"shared trace {path} not present")
    model = Empirical.from_file(path)
    assert len(model.num_prompt_tokens) == rows
    prompt, output = model.sample(50, make_rng())
    assert prompt.min() >= 1 and output.min() >= 1


def test_in_order_cycles() -> None:
    model = InOrder(num_prompt_tokens=np.array([4, 4]), output_len=np.array([8, 2]))
    prompt, output = model.sample(5, make_rng())
    np.testing.assert_array_equal(output, [8, 2, 8, 2, 8])
    np.testing.assert_array_equal(prompt, [4] * 5)
