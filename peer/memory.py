"""Process-wide memory tuning for a peer (TRANSPORT.md §4.1)."""

from __future__ import annotations

import ctypes


def tune_malloc() -> None:
    """Serve big buffers from the heap and keep freed memory: fresh 64 MiB buffers otherwise cost
    ~16k page faults each (both settings are needed). Call once at process start; a no-op off
    glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD: blocks < 256 MiB come from the heap
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not return freed heap to the OS
