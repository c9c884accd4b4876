"""The token pacer releases at the reader's pace and scores what the reader saw."""

from __future__ import annotations

import asyncio

import pytest

from andante.client import TokenPacer
from andante.metrics import qoe


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def _release(arrivals: list[float], tds: float) -> list[float]:
    async def main() -> list[float]:
        t = FakeTime()
        pacer = TokenPacer(tds, t.clock, t.sleep)
        for i, a in enumerate(arrivals):
            pacer.push(f"t{i}", a)
        pacer.close()
        out = []
        async for token in pacer:
            out.append(token.release)
        return out

    return asyncio.run(main())


def test_a_burst_is_spread_at_the_reading_pace() -> None:
    assert _release([1.0] * 4, tds=2.0) == pytest.approx([1.0, 1.5, 2.0, 2.5])


def test_slow_tokens_are_released_on_arrival() -> None:
    assert _release([1.0, 3.0, 3.1, 10.0], tds=2.0) == pytest.approx([1.0, 3.0, 3.5, 10.0])


def test_release_timeline_is_the_qoe_consumption_timeline() -> None:
    arrivals = [0.5, 0.6, 0.7, 2.0, 2.1, 2.2]
    released = _release(arrivals, tds=4.0)
    # QoE computes T_actual = max(arrival, T_prev + 1/tds): the pacer's release times
    assert qoe(0.0, released, 1.0, 4.0) == pytest.approx(qoe(0.0, arrivals, 1.0, 4.0))


def test_experienced_qoe() -> None:
    async def main() -> float:
        t = FakeTime()
        pacer = TokenPacer(10.0, t.clock, t.sleep)
        for i in range(5):
            pacer.push("x", 0.1 + 0.01 * i)
        pacer.close()
        async for _ in pacer:
            pass
        return pacer.experienced_qoe(0.0, ttft_target=1.0)

    assert asyncio.run(main()) == 1.0


def test_bad_pace() -> None:
    with pytest.raises(ValueError, match="tds"):
        TokenPacer(0.0)
