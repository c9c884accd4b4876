"""The engine process writes its step messages from a thread of its own (MessageSender)."""

from __future__ import annotations

import multiprocessing

import pytest

from andante.runtime.process import MessageSender


def test_engine_messages_are_written_in_order_off_the_engine_thread() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = MessageSender(writer)
    for i in range(200):
        sender.send(("step", i))
    sender.close()
    assert [reader.recv() for _ in range(200)] == [("step", i) for i in range(200)]


def test_a_gone_server_ends_the_engine_loop() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    reader.close()
    sender = MessageSender(writer)
    with pytest.raises((BrokenPipeError, OSError)):
        for _ in range(1000):  # the first failed write is raised by a later send
            sender.send(("step", 0))
            sender._thread.join(0.001)
    sender.close()
