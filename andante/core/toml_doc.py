"""One reader for andante's TOML files (the simulator's cluster file and the fleet file,
one format): the document as a table, refused in one line when it is not TOML or names a
key the file does not know."""

from __future__ import annotations

import tomllib
from collections.abc import Set
from typing import Any


def read_toml_table(text: str, known_keys: Set[str], what: str,
                    error: type[ValueError] = ValueError) -> dict[str, Any]:
    """The TOML document `text` (a `what`, e.g. "cluster file"); `error` with one line
    when it does not parse or has a top-level key outside `known_keys`."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} is not valid TOML: {exc}") from exc
    unknown = sorted(set(doc) - known_keys)
    if unknown:
        raise error(f"{what}: unknown key(s) {unknown}")
    return doc
