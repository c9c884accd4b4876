"""andante.perf.step_log: a step log's records read back as the shapes the engine ran."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from andante.perf.shape import BatchShape
from andante.perf.step_log import StepLogError, parse_steps, read_step_log, step_record


def _line(**fields) -> str:
    return json.dumps({"kind": "step", "duration": 0.01, **fields})


@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 2000)), min_size=1,
                max_size=12))
def test_a_written_record_reads_back_as_the_same_shape(chunks):
    shape = BatchShape.of(chunks)
    record = step_record(shape, 0.02, sum(c for _, c in chunks), engine="vllm")
    (step,) = parse_steps([json.dumps(record)])
    assert step.shape == shape and step.exact_shape and step.engine == "vllm"


@given(st.integers(1, 64), st.integers(1, 4000))
def test_decodes_alone_are_exact_without_pairs(batch, context):
    (step,) = parse_steps([_line(num_tokens=batch, num_decode_seqs=batch, num_seqs=batch,
                                 num_context_tokens=batch * context)])
    assert step.shape == BatchShape.decode(batch, context) and not step.exact_shape
    assert step.kind == "decode" and not step.has_prefill


def test_one_whole_prompt_is_exact_without_pairs():
    (step,) = parse_steps([_line(num_tokens=300, num_prefill_tokens=300)])
    assert step.shape == BatchShape.prefill(300) and step.kind == "prefill"


def test_a_mixed_step_from_aggregates_gives_the_decodes_the_context():
    # the vLLM adapter's minimal fields: one 64-token chunk and two decodes at 100 and 200
    (step,) = parse_steps([_line(num_tokens=66, num_prefill_tokens=64, num_decode_seqs=2,
                                 num_context_tokens=300, engine="vllm", t=5.0)])
    assert (step.shape.num_seqs, step.shape.num_decode_seqs) == (3, 2)
    assert step.shape.kv_tokens_read == 366 and step.kind == "mixed"
    assert step.shape.attn_pairs == 300 + 2 + (64 * 65) / 2


def test_other_kinds_blank_lines_and_unknown_fields_are_skipped():
    lines = [json.dumps({"kind": "request", "id": "r0"}), "",
             json.dumps({"kind": "setup", "device": "NVIDIA H200"}),
             _line(num_tokens=8, num_decode_seqs=8, num_context_tokens=80, source="x",
                   graph=True)]
    (step,) = parse_steps(lines)
    assert step.line == 4 and step.graph is True and step.engine is None


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "line 1: not JSON"),
    ("[1, 2]", "line 1: expected a JSON object"),
    (json.dumps({"kind": "step", "num_tokens": 3}), "lacks 'duration'"),
    (_line(), "lacks 'num_tokens'"),
    (_line(num_tokens=0), "0 tokens"),
    (_line(num_tokens=4, duration=-1), None),
    (_line(num_tokens=4, num_decode_seqs=True), "non-negative integer"),
    (_line(num_tokens=10, num_prefill_tokens=6, num_decode_seqs=2), "!= num_tokens"),
    (_line(num_tokens=10, num_decode_seqs=4, num_seqs=2), "num_seqs=2"),
    (_line(num_tokens=3, attn_pairs="many", kv_tokens_read=3), "attn_pairs"),
])
def test_a_malformed_step_names_its_line(line, message):
    with pytest.raises(StepLogError, match=message or "duration must be a positive"):
        parse_steps([json.dumps({"kind": "gc"}), line] if message is None else [line])


def test_an_unreadable_file_is_a_step_log_error(tmp_path):
    with pytest.raises(StepLogError, match="cannot read step log"):
        read_step_log(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StepLogError, match="not UTF-8"):
        read_step_log(binary)


def test_andantes_overhead_between_steps_is_part_of_a_steps_cost():
    steps = parse_steps([_line(num_tokens=1, overhead=0.004),
                         _line(num_tokens=1, overhead=None),
                         _line(num_tokens=1, overhead=-1e-6),  # a clock's jitter
                         _line(num_tokens=1)])
    assert [s.duration for s in steps] == pytest.approx([0.014, 0.01, 0.01, 0.01])
    with pytest.raises(StepLogError, match="line 1: overhead must be a number"):
        parse_steps([_line(num_tokens=1, overhead="some")])
