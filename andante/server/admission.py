"""Turn a validated API body into an engine `Request`, or refuse it with a clear 4xx.

Refused at once (DESIGN.md rule 7): an unknown model (404); an empty prompt, token ids
outside the vocabulary, a prompt longer than the context or than the whole KV cache,
a `max_tokens` that cannot fit, unsupported sampling options (400). The limits are the
engines' `EngineLimits`: no engine is asked. The bounded queue
(429) is checked by the caller, which knows how many requests are waiting.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from andante.core.request import Request
from andante.core.sampling import SLO, SamplingParams
from andante.engine.stats import EngineLimits
from andante.server.errors import APIError
from andante.server.protocol import ChatCompletionRequest, CompletionRequest, _Sampling

if TYPE_CHECKING:  # annotations only: the fleet front imports this module without torch
    from andante.models.interface import Tokenizer
    from andante.server.backend import Backend, ServedModel

# vLLM's _SAMPLING_EPS: a temperature this small is greedy (dividing the logits by it
# would overflow them to inf and sample nothing)
GREEDY_BELOW = 1e-5
MAX_STOP_CHARS = 1024  # the stop strings' total length (each step scans for them)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Admission:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # ---- prompts ------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        self.served(model)

    def served(self, model: str | None) -> ServedModel:
        """The served model of that name (None: the first one); 404 naming the known."""
        served = self.backend.served
        found = served.get(self.backend.model_name if model is None else model)
        if found is None:
            names = ", ".join(repr(name) for name in served)
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{names}", "model", "model_not_found")
        return found

    def completion_prompt(self, body: CompletionRequest) -> list[int]:
        prompt: Any = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "prompt: batched prompts are not supported; send one "
                               "prompt per request", "prompt", "invalid_value")
            prompt = prompt[0]
        served = self.served(body.model)
        tokenizer = served.tokenizer
        if isinstance(prompt, str):
            self._check_text_fits("prompt", len(prompt), served)
            return tokenizer.encode(prompt) if prompt else []
        ids: list[int] = list(prompt)
        vocab = tokenizer.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab})", "prompt", "invalid_value")
        return ids

    def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        if not any(m["content"] for m in messages):
            return []
        served = self.served(body.model)
        self._check_text_fits("messages", sum(len(m["content"]) for m in messages), served)
        return served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    @staticmethod
    def _check_text_fits(field: str, num_chars: int, served: ServedModel) -> None:
        """Refuse a text that cannot fit the context whatever it tokenizes to, before
        tokenizing it (which takes seconds for megabytes)."""
        limit = served.limits.max_model_len * served.tokenizer.max_token_chars
        if num_chars > limit:
            raise APIError(400, f"{field}: the text has {num_chars} characters; the model's "
                           f"context is {served.limits.max_model_len} tokens of at most "
                           f"{served.tokenizer.max_token_chars} characters each", field,
                           "context_length_exceeded")

    # ---- the request --------------------------------------------------------------
    def admit(
        self, body: _Sampling, prompt_ids: list[int], max_tokens: int | None,
        request_id: str, arrival: float,
    ) -> Request:
        field = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        if not prompt_ids:
            raise APIError(400, f"{field}: the prompt is empty", field, "invalid_value")
        served = self.served(body.model)
        self._check_fits(field, len(prompt_ids), served.limits)
        max_tokens = self._max_tokens(len(prompt_ids), max_tokens, served.limits)
        sampling = self._sampling(body, max_tokens, served.tokenizer)
        slo = SLO() if body.slo is None else SLO(**body.slo.model_dump())
        return Request(request_id, prompt_ids, sampling, arrival, priority=body.priority,
                       model=served.name, slo=slo)

    @staticmethod
    def _check_fits(field: str, num_prompt: int, limits: EngineLimits) -> None:
        """The prompt and at least one output token fit the context and the KV cache."""
        if num_prompt >= limits.max_model_len:
            problem = (f"the model's context is {limits.max_model_len} tokens (prompt + at "
                       "least 1 output token)")
        elif num_prompt + 1 > limits.kv_capacity_tokens:
            problem = f"the whole KV cache holds {limits.kv_capacity_tokens}"
        else:
            return
        raise APIError(400, f"{field}: prompt has {num_prompt} tokens; {problem}", field,
                       "context_length_exceeded")

    @staticmethod
    def _max_tokens(num_prompt: int, requested: int | None, limits: EngineLimits) -> int:
        model_len = limits.max_model_len
        capacity = limits.kv_capacity_tokens
        room = min(model_len, capacity) - num_prompt
        if requested is None:
            return room
        if num_prompt + requested > model_len:
            raise APIError(
                400, f"max_tokens: this model's maximum context length is {model_len} tokens; "
                f"you requested {num_prompt + requested} ({num_prompt} in the prompt, "
                f"{requested} in the completion)", "max_tokens", "context_length_exceeded")
        if num_prompt + requested > capacity:
            raise APIError(
                400, f"max_tokens: the KV cache holds {capacity} tokens; you requested "
                f"{num_prompt + requested} ({num_prompt} in the prompt, {requested} in the "
                "completion)", "max_tokens", "context_length_exceeded")
        return requested

    @staticmethod
    def _sampling(body: _Sampling, max_tokens: int, tokenizer: Tokenizer) -> SamplingParams:
        if body.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens: {body.min_tokens} is more than max_tokens "
                           f"({max_tokens})", "min_tokens", "invalid_value")
        stops = body.stop_strings
        if sum(map(len, stops)) > MAX_STOP_CHARS:
            raise APIError(400, f"stop: the stop strings have {sum(map(len, stops))} "
                           f"characters in all; the limit is {MAX_STOP_CHARS}", "stop",
                           "invalid_value")
        eos = tuple(tokenizer.eos_token_ids)
        stop_ids = tuple(body.stop_token_ids or ())
        if not body.ignore_eos:
            stop_ids += tuple(t for t in eos[1:] if t not in stop_ids)
        top_k = body.top_k if body.top_k is not None and body.top_k > 0 else None
        return SamplingParams(
            max_tokens=max_tokens, top_k=top_k, top_p=body.top_p, seed=body.seed, stop=stops,
            temperature=0.0 if body.temperature < GREEDY_BELOW else body.temperature,
            stop_token_ids=stop_ids, ignore_eos=body.ignore_eos,
            eos_token_id=eos[0] if eos else None,
            repetition_penalty=body.repetition_penalty or 1.0,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            min_p=body.min_p or 0.0, min_tokens=body.min_tokens,
        )


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_output,
            "total_tokens": num_prompt + num_output}
