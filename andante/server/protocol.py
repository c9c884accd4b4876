"""Request bodies of the OpenAI-compatible API (strict: unknown fields and wrong types
are errors that name the field).

Beyond OpenAI's fields: vLLM's `top_k`, `ignore_eos`, `stop_token_ids`, `priority`
(lower runs first), `repetition_penalty`, `min_p` and `min_tokens` (served as vLLM
serves them, as are OpenAI's `presence_penalty` and `frequency_penalty`), and andante's
`slo` object: `ttft` (s), `tbt` (s between tokens), `tds` (the reader's tokens/s) and
`deadline` (s, end to end).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveSeconds = Field(default=None, gt=0, allow_inf_nan=False)
MAX_STOP = 4  # OpenAI's limit on stop sequences
INT64 = 1 << 63
# Every list is bounded and stops at its first bad item (`fail_fast`): a body of a
# million bad items would otherwise cost a million error objects on the preparation
# thread, holding the interpreter lock while every stream waits.
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 256
MAX_PROMPT_TOKENS = 1 << 18  # token-id prompts (a longer one cannot fit any context)
MAX_PROMPTS = 64  # list prompts (one is served; admission says so)
MAX_STOP_TOKEN_IDS = 256


def _at_most(max_length: int, min_length: int = 0) -> Any:
    """The bound of a list: at most `max_length` items, validation stopping at the first
    bad one."""
    return Field(min_length=min_length, max_length=max_length, fail_fast=True)


TokenIds = Annotated[list[int], _at_most(MAX_PROMPT_TOKENS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SLOBody(_Strict):
    ttft: float | None = PositiveSeconds
    tbt: float | None = PositiveSeconds
    tds: float | None = PositiveSeconds
    deadline: float | None = PositiveSeconds


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: float = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stop: str | Annotated[list[str], _at_most(MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[int], _at_most(MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    presence_penalty: float | None = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    min_tokens: int = Field(default=0, ge=0)
    user: str | None = None
    priority: int = Field(default=0, ge=-INT64, lt=INT64)
    slo: SLOBody | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: (str | TokenIds | Annotated[list[str], _at_most(MAX_PROMPTS)]
             | Annotated[list[TokenIds], _at_most(MAX_PROMPTS)])
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], _at_most(MAX_CONTENT_PARTS)]
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], _at_most(MAX_MESSAGES, min_length=1)]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: Literal[False] = False

    @property
    def max_output_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


FIELD_NAMES: frozenset[str] = frozenset(
    name
    for model in (CompletionRequest, ChatCompletionRequest, ChatMessage, SLOBody, StreamOptions)
    for name in model.model_fields
)


def request_schema(model: type[BaseModel]) -> dict[str, Any]:
    """FastAPI's `openapi_extra` declaring `model` as a route's JSON body (the routes read
    the raw body themselves), with its sub-models inlined (no `$defs` to resolve)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    content = {"application/json": {"schema": _inline(schema, defs)}}
    return {"requestBody": {"required": True, "content": content}}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {key: _inline(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(value, defs) for value in node]
    return node
