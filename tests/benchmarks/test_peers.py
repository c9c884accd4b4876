"""The peers' tooling: the bf16 GGUF writer, the setup script's argument checks and
engine_vs_peers' summaries (the peers themselves are not installed in CI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.scripts import load_script
from tests.models.gguf_helpers import write_tiny_gguf
from tests.models.helpers import make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / "benchmarks" / "peers"


def test_bf16_gguf_keeps_metadata_and_weights(tmp_path: Path) -> None:
    import gguf

    source = write_tiny_gguf(make_tiny_checkpoint(tmp_path / "hf"), tmp_path / "q8.gguf",
                             quantize=("attn", "ffn"))
    out = tmp_path / "bf16.gguf"
    writer = load_script(PEERS / "write_bf16_gguf.py")
    assert writer.main(["--gguf", str(source), "--out", str(out)]) == 0
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(out)
    assert set(after.fields) == set(before.fields) | {"general.file_type"}
    assert after.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_BF16
    olds = {t.name: t for t in before.tensors}
    assert {t.name for t in after.tensors} == set(olds)
    bf16 = gguf.GGMLQuantizationType.BF16
    for tensor in after.tensors:
        old = olds[tensor.name]
        expected = gguf.quants.dequantize(old.data, old.tensor_type).reshape(-1)
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1)
        assert tensor.tensor_type in (bf16, gguf.GGMLQuantizationType.F32)
        assert (tensor.tensor_type == bf16) == (len(old.shape) > 1)
        np.testing.assert_allclose(got, expected, rtol=2 ** -8, atol=1e-30)


@pytest.mark.parametrize("argv", [["--only", "cuda"], ["--bogus"], ["--dir"]])
def test_setup_refuses_bad_arguments(argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run([str(PEERS / "setup"), "--dir", str(tmp_path), *argv],
                          capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "peers/setup: error:" in proc.stderr


def test_setup_help_names_every_part() -> None:
    proc = subprocess.run([str(PEERS / "setup"), "--help"], capture_output=True, text=True,
                          check=True)
    for part in ("vllm-venv", "llama-venv", "bf16.gguf", "ANDANTE_PEERS"):
        assert part in proc.stdout


def _record(prefill: float, b1: float, b8: float, conc: float) -> dict[str, object]:
    return {"prefill_ms": prefill, "concurrent": {"out_tok_s": conc},
            "decode": {"b1": {"ms_per_step": b1, "ms_per_step_wall": b1},
                       "b8": {"ms_per_step": b8, "ms_per_step_wall": b8}}}


def test_summary_takes_medians_and_ratios_favour_andante_above_one() -> None:
    bench = load_script(REPO / "benchmarks" / "engine_vs_peers.py")
    quiet = {"others_cpu_share": 0.0}
    busy = {"others_cpu_share": 0.9}
    runs = {
        "andante": [{"machine": quiet, "record": _record(100, 20, 30, 300)},
                    {"machine": busy, "record": _record(300, 60, 90, 100)},
                    {"machine": quiet, "record": _record(110, 22, 33, 310)}],
        "vllm": [{"machine": quiet, "record": _record(200, 25, 30, 150)},
                 {"machine": quiet, "record": None}],
    }
    summary = bench.summarize(runs, busy_share=0.25)
    assert summary["medians"]["andante"]["prefill_ms"] == 110
    assert summary["medians"]["andante"]["busy_rounds"] == 1
    ratios = summary["ratios"]["vllm"]
    assert ratios["prefill_ms"] == pytest.approx(200 / 110, abs=1e-3)
    assert ratios["concurrent_tok_s"] == pytest.approx(300 / 150, abs=1e-3)
    assert ratios["decode_b8_ms"] == pytest.approx(30 / 33, abs=1e-3)  # andante behind


def test_cpu_meter_reports_shares_between_zero_and_one() -> None:
    bench = load_script(REPO / "benchmarks" / "engine_vs_peers.py")
    result, machine = bench.CpuMeter().measure(lambda: sum(range(100_000)))
    assert result == sum(range(100_000))
    assert machine["others_cpu_share"] >= 0.0
    assert set(machine) >= {"loadavg_1m_before", "loadavg_1m_after", "wall_s"}
