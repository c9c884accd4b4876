"""The executor's malloc tuning: applied once on glibc, skipped when disabled."""

import ctypes.util
import platform

import pytest

from andante.exec import malloc_tuning


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc_tuning, "_applied", False)
    monkeypatch.setenv(malloc_tuning.DISABLE_ENV, "1")
    assert malloc_tuning.keep_freed_memory() is False
    assert malloc_tuning._applied is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_applied_once_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc_tuning, "_applied", False)
    monkeypatch.delenv(malloc_tuning.DISABLE_ENV, raising=False)
    calls: list[tuple[int, int]] = []
    real = ctypes.CDLL(ctypes.util.find_library("c"))

    class Recorder:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return int(real.mallopt(param, value))

    monkeypatch.setattr(malloc_tuning.ctypes, "CDLL", lambda name: Recorder())
    assert malloc_tuning.keep_freed_memory() is True
    assert malloc_tuning.keep_freed_memory() is True  # once: no second pair of calls
    assert calls == [(malloc_tuning.M_MMAP_THRESHOLD, malloc_tuning.MMAP_THRESHOLD),
                     (malloc_tuning.M_TRIM_THRESHOLD, malloc_tuning.TRIM_THRESHOLD)]
