from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from andante.workload import lengths


def test_fixed() -> None:
    prompts, outputs = lengths.fixed(128, 64, 5)
    assert prompts.tolist() == [128] * 5 and outputs.tolist() == [64] * 5
    with pytest.raises(ValueError, match="fixed lengths"):
        lengths.fixed(0, 64, 5)


def test_uniform_is_inclusive(rng: np.random.Generator) -> None:
    prompts, outputs = lengths.uniform((3, 5), (7, 7), 2000, rng)
    assert set(prompts.tolist()) == {3, 4, 5} and set(outputs.tolist()) == {7}
    with pytest.raises(ValueError, match="prompt range"):
        lengths.uniform((5, 3), (1, 2), 10, rng)


def test_sharegpt_means_match_readme(sharegpt_csv: Path, rng: np.random.Generator) -> None:
    prompts, outputs = lengths.sharegpt(sharegpt_csv, 20_000, rng)
    assert prompts.dtype == np.int64 and len(prompts) == len(outputs) == 20_000
    assert prompts.mean() == pytest.approx(2340, rel=0.03)
    assert outputs.mean() == pytest.approx(439, rel=0.03)
    assert prompts.min() >= 1 and outputs.min() >= 1


def test_sharegpt_max_context(sharegpt_csv: Path, rng: np.random.Generator) -> None:
    prompts, outputs = lengths.sharegpt(sharegpt_csv, 5000, rng, max_context=2048)
    assert np.all(prompts + outputs <= 2048)
    with pytest.raises(ValueError, match="no row fits"):
        lengths.sharegpt(sharegpt_csv, 10, rng, max_context=2)


def test_azure_lengths(traces_dir: Path, rng: np.random.Generator) -> None:
    path = traces_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    prompts, outputs = lengths.from_trace(path, 20_000, rng)
    assert prompts.mean() == pytest.approx(2048, rel=0.05)
    assert outputs.mean() == pytest.approx(28, rel=0.08)


def test_rows_stay_paired(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,1\n20,2\n30,3\n")
    prompts, outputs = lengths.sharegpt(path, 100, rng)
    np.testing.assert_array_equal(prompts, outputs * 10)


def test_bad_files(tmp_path: Path, rng: np.random.Generator) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(ValueError, match=r"nope\.csv: no such file"):
        lengths.sharegpt(missing, 10, rng)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"wrong\.csv: missing column\(s\) num_prefill_tokens"):
        lengths.sharegpt(wrong, 10, rng)
    empty = tmp_path / "empty.csv"
    empty.write_text("num_prefill_tokens,num_decode_tokens\n")
    with pytest.raises(ValueError, match="no data rows"):
        lengths.sharegpt(empty, 10, rng)
    junk = tmp_path / "junk.csv"
    junk.write_text("num_prefill_tokens,num_decode_tokens\n12,x\n")
    with pytest.raises(ValueError, match="num_decode_tokens has a non-numeric value"):
        lengths.sharegpt(junk, 10, rng)
