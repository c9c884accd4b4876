"""Argument helpers shared by sub-commands."""

from __future__ import annotations

import argparse
import json
from typing import Any


def parse_key_values(items: list[str] | None) -> dict[str, Any]:
    """["a=1", "b=x"] -> {"a": 1, "b": "x"}; values are parsed as JSON when they can be."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """vllm bench serve's `--goodput ttft:MS tpot:MS` -> {"ttft": seconds, ...}."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        name, sep, ms = item.partition(":")
        if not sep:
            raise ValueError(f"--goodput expects NAME:MILLISECONDS, got {item!r}")
        try:
            out[name] = float(ms) / 1000.0
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {ms!r} is not a number") from None
    return out


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM's --block-size choices


def block_size(text: str) -> int:
    """A KV block size vLLM accepts (its paged-attention kernels' sizes)."""
    value = int(text)
    if value not in BLOCK_SIZES:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's block sizes), got {text}")
    return value


def add_prefix_caching_arg(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """`--no-prefix-caching` (the one definition that serve, simulate and generate share);
    read it as `args.enable_prefix_caching`."""
    group.add_argument("--no-prefix-caching", dest="enable_prefix_caching",
                       action="store_false",
                       help="turn off automatic prefix caching (on by default: requests "
                       "sharing a prefix of full KV blocks reuse the cached blocks)")
