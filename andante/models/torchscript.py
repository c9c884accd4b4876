"""TorchScript for the engine's hot functions, with an eager fallback.

Design note. The fused layers (andante.exec.torch_layers) and the functions they call
are compiled with `torch.jit.script` to take Python's per-call cost off the stepping
thread; scripting changes no kernel and no order of operations, so results are
bit-identical to the eager functions. torch marks TorchScript deprecated (the warning
is silenced here, once per function); where scripting fails (a torch without it, or a
construct it rejects) or `ANDANTE_NO_TORCHSCRIPT=1` is set, the plain Python function
is used instead, so the engine still runs, only slower.
"""

import logging
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from andante.perf.paths import env_switch

log = logging.getLogger(__name__)

DISABLE_ENV = "ANDANTE_NO_TORCHSCRIPT"

F = TypeVar("F", bound=Callable[..., Any])


def script(fn: F) -> F:
    """`torch.jit.script(fn)`, or `fn` itself when TorchScript is off or fails."""
    if env_switch(DISABLE_ENV):
        return fn
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(fn)  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 - any scripting failure falls back to eager
        log.warning("TorchScript unavailable for %s (%s): running it eagerly",
                    fn.__qualname__, exc)
        return fn
