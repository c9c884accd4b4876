"""A toy model for fast serving tests and demos: a byte tokenizer and a timed fake executor.

`ByteTokenizer` implements `andante.models.interface.Tokenizer` over UTF-8 bytes (ids
0-255) plus three special tokens and a ChatML template. `ToyExecutor` implements the
`Executor` protocol: it sleeps `step_time` (+ `prefill_time_per_token` per prompt token)
per step and samples the bytes of a fixed text, position by position, so streams are
deterministic and readable. It never samples EOS.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from andante.exec.batch import StepBatch, StepResult
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel

ENDOFTEXT, IM_START, IM_END = 256, 257, 258
SPECIAL_TOKENS = {ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
TOY_TEXT = "The quick brown fox jumps over the lazy dog. "


class ByteDecoder:
    """Incremental UTF-8 decoder: emits text only once a character is complete."""

    def __init__(self, skip_special_tokens: bool = True) -> None:
        self.text = ""
        self._pending = b""
        self._skip = skip_special_tokens

    def push(self, token_id: int) -> str:
        if token_id in SPECIAL_TOKENS:
            piece = "" if self._skip else SPECIAL_TOKENS[token_id]
        else:
            self._pending += bytes([token_id])
            try:
                piece = self._pending.decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.reason != "unexpected end of data" or len(self._pending) >= 4:
                    piece = self._pending.decode("utf-8", errors="replace")
                else:
                    return ""
            self._pending = b""
        self.text += piece
        return piece


class ByteTokenizer:
    """UTF-8 bytes as tokens; `<|im_end|>` and `<|endoftext|>` end generation."""

    vocab_size = 259
    eos_token_ids: tuple[int, ...] = (IM_END, ENDOFTEXT)
    bos_token_id: int | None = None
    max_token_chars = 1  # a character is one or more byte tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        decoder = ByteDecoder(skip_special_tokens)
        for token_id in token_ids:
            decoder.push(token_id)
        return decoder.text

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids += [IM_START, *self.encode(f"{message['role']}\n{message['content']}"), IM_END]
            ids += self.encode("\n")
        if add_generation_prompt:
            ids += [IM_START, *self.encode("assistant\n")]
        return ids

    def incremental_decoder(self, skip_special_tokens: bool = True) -> ByteDecoder:
        return ByteDecoder(skip_special_tokens)


class ToyExecutor:
    """Fake forward passes that take real time; tokens spell `TOY_TEXT` over and over."""

    def __init__(
        self,
        num_device_blocks: int = 4096,
        num_host_blocks: int = 1024,
        step_time: float = 0.005,
        prefill_time_per_token: float = 0.0,
        text: str = TOY_TEXT,
    ) -> None:
        self.cost_model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
        self.blocks = (num_device_blocks, num_host_blocks)
        self.step_time = step_time
        self.prefill_time_per_token = prefill_time_per_token
        self._source = text
        self._text = text.encode("utf-8")  # its "weights": what it generates from
        self.sleeping: int | None = None

    # ---- sleep mode (andante.exec.base.Sleepable) ----------------------------------------
    def sleep(self, level: int) -> None:
        """Level 1 keeps the "weights" (the text), level 2 drops them; either way the
        executor serves nothing until woken."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        self.sleeping = max(level, self.sleeping or 0)
        if level == 2:
            self._text = b""

    def wake_up(self) -> None:
        if self.sleeping == 2:
            self._text = self._source.encode("utf-8")  # "reloaded"
        self.sleeping = None

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self.blocks

    def execute(self, batch: StepBatch) -> StepResult:
        if self.sleeping is not None:
            raise RuntimeError("the toy executor is asleep (POST /wake_up)")
        started = time.perf_counter()
        num_prefill = sum(n for n in batch.num_new_tokens if n > 1)
        duration = self.step_time + self.prefill_time_per_token * num_prefill
        if duration > 0:
            time.sleep(duration)
        text = self._text
        sampled: list[int | None] = []
        for req, sample in zip(batch.requests, batch.samples, strict=True):
            sampled.append(text[req.num_output_tokens % len(text)] if sample else None)
        return StepResult(sampled, duration=time.perf_counter() - started)
