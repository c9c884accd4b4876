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
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: list[int] | None = None
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
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
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
