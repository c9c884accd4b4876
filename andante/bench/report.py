"""An experiment report: markdown with tables and PNG plots, plus results.json."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (reports are files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


class Report:
    """Accumulates sections, tables, figures and named results; `write()` saves them."""

    def __init__(self, directory: Path, title: str) -> None:
        self.directory = directory
        self.title = title
        self._parts: list[str] = [f"# {title}\n"]
        self.results: dict[str, Any] = {}

    def section(self, heading: str, text: str = "") -> None:
        self._parts.append(f"\n## {heading}\n")
        if text:
            self._parts.append(text.strip() + "\n")

    def text(self, text: str) -> None:
        self._parts.append(text.strip() + "\n")

    def table(
        self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
    ) -> None:
        if not rows:
            self._parts.append("_(no rows)_\n")
            return
        cols = list(columns or rows[0].keys())
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(row.get(c, "")) for c in cols) + " |" for row in rows]
        self._parts.append("\n".join(lines) + "\n")

    def figure(self, name: str, fig: Any, caption: str = "") -> Path:
        """Save a matplotlib figure as `<name>.png` and reference it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        _close(fig)
        self._parts.append(f"\n![{caption or name}]({path.name})\n")
        if caption:
            self._parts.append(f"*{caption}*\n")
        return path

    def result(self, key: str, value: Any) -> None:
        self.results[key] = value

    def write(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "report.md"
        path.write_text("".join(p if p.endswith("\n") else p + "\n" for p in self._parts))
        (self.directory / "results.json").write_text(
            json.dumps(self.results, indent=2, default=_json_default)
        )
        return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)


def _close(fig: Any) -> None:
    """Release a saved figure (pyplot keeps every open figure until it is closed)."""
    from matplotlib import pyplot

    pyplot.close(fig)
