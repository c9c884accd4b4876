"""`phases.decodes_first`: a chunked step's decode order puts the streams before the prompts
still prefilling, keeping each group's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from andante.policies.phases import decodes_first
from tests.engine.helpers import make_request


@given(st.lists(st.integers(min_value=0, max_value=3), max_size=12))
def test_decodes_first_is_a_stable_partition(uncomputed: list[int]) -> None:
    order = []
    for i, left in enumerate(uncomputed):
        req = make_request(f"r{i}", prompt_len=4, max_tokens=8)
        req.num_computed_tokens = 4 - left  # `left` prompt tokens still to compute
        order.append(req)
    result = decodes_first(order)
    decoding = [r for r in order if r.num_uncomputed_tokens <= 1]
    prefilling = [r for r in order if r.num_uncomputed_tokens > 1]
    assert result == decoding + prefilling
    if not prefilling:
        assert result is order  # nothing to move: the caller's list, not a copy
