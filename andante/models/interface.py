"""The seam between a loaded checkpoint and its users (engine factory, server, CLI).

`load_model(path)` (in `andante.models.loader`) returns a `LoadedModel`; the server
tokenizes with its `tokenizer`, builds a `TorchExecutor` from it and hands that to
`andante.engine.build_engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class IncrementalDecoder(Protocol):
    """Turns a stream of token ids into text pieces, never splitting a character.

    `push` returns the text completed by this token (possibly ""); `text` is everything
    emitted so far. Used for streaming and for stop strings.
    """

    text: str

    def push(self, token_id: int) -> str: ...


class Tokenizer(Protocol):
    """Text <-> token ids for one model, with its chat template and stop tokens."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]  # every id that ends generation (e.g. <|im_end|>)
    bos_token_id: int | None

    @property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: a text longer than the context
        times this cannot fit (the server refuses it before tokenizing it)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the conversation rendered by the model's own chat template."""
        ...

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder: ...
