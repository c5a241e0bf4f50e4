"""Process-wide memory tuning for a peer (docs/transport.md#memory)."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc <malloc.h>


def tune_malloc() -> None:
    """Serve big buffers from the heap and keep freed memory: fresh 64 MiB buffers otherwise cost
    ~16k page faults each (both thresholds are needed). One arena for every thread: a thread's
    own arena lives in 64 MiB heaps that glibc unmaps as soon as one empties, whatever the trim
    threshold, so the training thread re-faulted 3–6k fresh pages (12–24 MB) per step of the
    ~1M-parameter benchmark (bench/step_overhead.py): a few dozen at most with one arena. Call
    once at process start, before other threads allocate; a no-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)  # blocks < 256 MiB come from the heap
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # do not return freed heap to the OS
    libc.mallopt(M_ARENA_MAX, 1)  # threads share the main arena (see above)
