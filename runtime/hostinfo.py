"""The facts of a host that decide whether two hosts compute the same bits (`host_facts`), and
how two such records differ (`host_differences`).

A run is deterministic for a given seed, code, torch build, CPU and thread count; the same
configuration on another host can end elsewhere because the kernels chosen there (by the CPU's
instruction set, the BLAS build, oneDNN) sum in another order and training amplifies it. A CPU's
model name does not say enough: two virtual machines sold as the same "AMD EPYC" can expose
different flags (AVX-512 or not), so torch dispatches other kernels. `host_facts` records, as one
flat JSON object (dotted keys):

- ``cpu.*``: vendor, family, model, stepping, microcode, model name (``/proc/cpuinfo``), the
  flags as a sorted list (``cpu.flags``, information), the instruction-set flags among them
  (``cpu.isa``: `isa_flags`) and a short hash of those (``cpu.isa_sha``) — what torch's kernels
  dispatch on; the other flags (``md_clear``, ``flush_l1d``, ``ibpb``, ``hypervisor``, …) change
  with the kernel, the microcode or the hypervisor, not with the kernels chosen;
- ``cores``: logical cores;
- ``numpy.*``: the version and its BLAS / LAPACK (name, version, OpenBLAS configuration) when
  numpy is already imported (``numpy.show_config(mode="dicts")``), else only the version;
- ``torch.*`` (only when torch is already imported: the orchestrator never loads it): version,
  CPU capability (the instruction set ATen dispatches to), MKL / oneDNN / OpenMP versions, the
  parallel backend, a digest of ``torch.__config__.show()`` (the build), threads and interop
  threads;
- ``env.*``: the thread and dispatch environment variables that are set (``OMP_NUM_THREADS``,
  ``MKL_NUM_THREADS``, ``ATEN_CPU_CAPABILITY``, …);
- ``python.*``: version, implementation, build, compiler; ``os.*``: system, kernel release, libc;
- ``data.<dataset>.*`` (only when a dataset built from this host's files was read in this
  process: ``data.pystdlib-chars.*``, `concord.core.data.pystdlib.corpus_host_facts`): the
  corpus's file count, bytes and its ``files_sha256`` / ``corpus_sha256`` — the standard library
  of another Python build is other training data, which `concord.lab.verify` tells apart from
  another host ("corpus differs").

It reads files and already-loaded modules only (a few milliseconds; no import of torch or numpy).
`DECISIVE` names the facts that change float results; the others (microcode, kernel, Python
build, thread counts of the recording process) are recorded to explain, not to decide.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "CORPUS_DECISIVE",
    "CORPUS_MODULES",
    "DECISIVE",
    "ENV_VARS",
    "HostDifference",
    "host_differences",
    "host_facts",
    "isa_flags",
]

JSONValue = Any  # a JSON value (core.records.JSON, without importing core here)

ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "KMP_AFFINITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
)
"""Environment variables that change threads or the kernels chosen (recorded when set)."""

_CPU_FIELDS = {
    "vendor_id": "cpu.vendor",
    "cpu family": "cpu.family",
    "model": "cpu.model",
    "stepping": "cpu.stepping",
    "microcode": "cpu.microcode",
    "model name": "cpu.model_name",
}

CORPUS_MODULES = ("concord.core.data.pystdlib",)
"""Modules of datasets read from this host's files; each has ``corpus_host_facts()``."""
CORPUS_DECISIVE = (
    "data.pystdlib-chars.files_sha256",
    "data.pystdlib-chars.corpus_sha256",
)
"""The corpus facts that decide (other data, other results)."""

DECISIVE = (
    "cpu.vendor",
    "cpu.family",
    "cpu.model",
    "cpu.stepping",
    "cpu.isa_sha",
    "numpy.version",
    "numpy.blas",
    "numpy.blas_config",
    "torch.version",
    "torch.cpu_capability",
    "torch.config_sha",
    "torch.mkl",
    "torch.onednn",
    "torch.openmp",
    "torch.parallel_backend",
    *(f"env.{name}" for name in ENV_VARS),
    *CORPUS_DECISIVE,
)
"""The facts whose difference can change float results (an instruction-set difference is shown
through ``cpu.isa``, the hash only decides; ``cpu.flags`` is recorded to explain)."""

_ISA_PREFIXES = ("sse", "avx", "amx", "sve", "sme", "asimd")
_ISA_EXACT = frozenset({
    "ssse3", "fma", "fma4", "f16c", "bmi1", "bmi2", "adx", "sha_ni", "aes", "pclmulqdq",
    "popcnt", "movbe", "lzcnt", "abm", "xop", "vpclmulqdq", "vaes", "gfni", "mmx", "cx16",
    # arm64
    "fp", "fphp", "pmull", "sha1", "sha2", "sha3", "sha512", "crc32", "atomics", "dotprod",
    "i8mm", "bf16", "fcma", "jscvt", "frint", "f32mm", "f64mm",
})  # fmt: skip


def isa_flags(flags: list[str]) -> list[str]:
    """The flags of ``flags`` that name an instruction set kernels dispatch on (x86: sse*,
    ssse3, avx* (avx512*, avx_vnni …), fma, f16c, bmi1/2, adx, amx*, sha_ni, aes, pclmulqdq,
    popcnt, movbe …; arm64: fp, asimd*, sve*, sme*, dotprod, i8mm, bf16 …), sorted."""
    return sorted(
        f for f in set(flags) if f in _ISA_EXACT or f.startswith(_ISA_PREFIXES) or "vnni" in f
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _cpu(cpuinfo: str) -> dict[str, JSONValue]:
    """The first processor's block of ``/proc/cpuinfo`` text."""
    facts: dict[str, JSONValue] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in _CPU_FIELDS:
            facts[_CPU_FIELDS[key]] = value
        elif key in ("flags", "Features"):  # x86, arm64
            flags = sorted(set(value.split()))
            facts["cpu.flags"] = flags
            facts["cpu.isa"] = isa_flags(flags)
            facts["cpu.isa_sha"] = _sha(" ".join(facts["cpu.isa"]))
    return facts


def _numpy() -> dict[str, JSONValue]:
    np = sys.modules.get("numpy")
    if np is None:
        try:
            return {"numpy.version": metadata.version("numpy")}
        except metadata.PackageNotFoundError:
            return {}
    facts: dict[str, JSONValue] = {"numpy.version": str(np.__version__)}
    try:
        config = np.show_config(mode="dicts")
    except TypeError:  # numpy < 1.26 has no mode=
        return facts
    deps = config.get("Build Dependencies", {}) if isinstance(config, dict) else {}
    for kind in ("blas", "lapack"):
        dep = deps.get(kind) or {}
        if dep:
            facts[f"numpy.{kind}"] = f"{dep.get('name', '?')} {dep.get('version', '?')}".strip()
    blas = deps.get("blas") or {}
    if blas.get("openblas configuration"):
        facts["numpy.blas_config"] = str(blas["openblas configuration"])
    simd = config.get("SIMD Extensions", {}) if isinstance(config, dict) else {}
    if isinstance(simd, dict) and simd.get("found"):
        facts["numpy.simd"] = list(simd["found"])
    return facts


def _version_line(text: str, pattern: str) -> str | None:
    match = re.search(pattern, text, re.MULTILINE)
    return match.group(1).strip() if match else None


def _torch() -> dict[str, JSONValue]:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "__config__"):
        return {}
    facts: dict[str, JSONValue] = {"torch.version": str(torch.__version__)}
    with contextlib.suppress(AttributeError, RuntimeError):  # torch < 2.1: no such call
        facts["torch.cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
    build = str(torch.__config__.show())
    parallel = str(torch.__config__.parallel_info())
    facts["torch.config_sha"] = _sha(build)
    facts["torch.mkl"] = _version_line(build, r"Math Kernel Library Version (\S+)")
    facts["torch.onednn"] = _version_line(build, r"MKL-DNN (v[\d.]+)")
    facts["torch.openmp"] = _version_line(build, r"- (OpenMP \d+)")
    facts["torch.parallel_backend"] = _version_line(parallel, r"ATen parallel backend: (.+)$")
    facts["torch.threads"] = int(torch.get_num_threads())
    facts["torch.interop_threads"] = int(torch.get_num_interop_threads())
    return facts


def _corpora() -> dict[str, JSONValue]:
    """``data.*`` facts of the corpora read in this process (`CORPUS_MODULES` already loaded)."""
    facts: dict[str, JSONValue] = {}
    for name in CORPUS_MODULES:
        read = getattr(sys.modules.get(name), "corpus_host_facts", None)
        if callable(read):
            facts.update(read())
    return facts


def host_facts(*, cpuinfo: str | None = None) -> dict[str, JSONValue]:
    """This host's facts (see the module's docstring), a flat JSON object with dotted keys;
    ``cpuinfo``: the text of ``/proc/cpuinfo`` (None: read it; absent on other systems: the
    ``cpu.*`` facts are what `platform` knows). Never imports torch or numpy."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    facts: dict[str, JSONValue] = _cpu(cpuinfo)
    if "cpu.model_name" not in facts:  # platform.processor() may spawn ``uname -p``
        facts["cpu.model_name"] = platform.processor() or platform.machine() or "unknown"
    facts["cpu.machine"] = platform.machine()
    facts["cores"] = os.cpu_count() or 1
    facts.update(_numpy())
    facts.update(_torch())
    for name in ENV_VARS:
        if name in os.environ:
            facts[f"env.{name}"] = os.environ[name]
    facts["python.version"] = platform.python_version()
    facts["python.implementation"] = platform.python_implementation()
    facts["python.build"] = " ".join(platform.python_build())
    facts["python.compiler"] = platform.python_compiler()
    facts["os.system"] = platform.system()
    facts["os.kernel"] = platform.release()
    facts["os.libc"] = " ".join(platform.libc_ver()).strip()
    facts.update(_corpora())
    return {k: v for k, v in facts.items() if v is not None}


_FLAG_LABELS: Mapping[str, str] = {"cpu.isa": "cpu flags", "cpu.flags": "cpu flags (not ISA)"}


class HostDifference:
    """One fact that differs between a recorded host and another: its key, both values, and
    whether it is `DECISIVE`. ``str()`` is the short form a verdict shows: "numpy.version 1.26.4
    → 2.1.0", "cpu flags +avx512f -sse4a" (the instruction-set flags, ``cpu.isa``), "cpu flags
    (not ISA) +md_clear" (the others, informative)."""

    def __init__(self, key: str, recorded: JSONValue, other: JSONValue) -> None:
        self.key, self.recorded, self.other = key, recorded, other
        self.decisive = key in DECISIVE or key == "cpu.isa"

    def __str__(self) -> str:
        if self.key in _FLAG_LABELS and isinstance(self.recorded, list):
            other = self.other if isinstance(self.other, list) else []
            added = sorted(set(other) - set(self.recorded))
            removed = sorted(set(self.recorded) - set(other))
            if self.key == "cpu.flags":  # the ISA flags are their own difference
                added, removed = [f for f in added if not isa_flags([f])], [
                    f for f in removed if not isa_flags([f])]  # fmt: skip
            signed = [*(f"+{f}" for f in added), *(f"-{f}" for f in removed)]
            return " ".join([_FLAG_LABELS[self.key], *signed])

        def show(value: JSONValue) -> str:
            return "(not recorded)" if value is None else str(value)

        return f"{self.key} {show(self.recorded)} → {show(self.other)}"

    def __repr__(self) -> str:
        return f"HostDifference({self})"


def _with_isa(facts: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    """``facts`` with ``cpu.isa`` derived from ``cpu.flags`` when it lacks it (an older record)."""
    flags = facts.get("cpu.flags")
    if "cpu.isa" in facts or not isinstance(flags, list):
        return facts
    return {**facts, "cpu.isa": isa_flags([str(f) for f in flags])}


def _not_isa(flags: JSONValue) -> set[str]:
    """The flags that are not instruction sets (`isa_flags`) of a ``cpu.flags`` value."""
    names = {str(f) for f in flags} if isinstance(flags, list) else set()
    return names - set(isa_flags(list(names)))


def host_differences(
    recorded: Mapping[str, JSONValue], other: Mapping[str, JSONValue], *, decisive: bool = True
) -> list[HostDifference]:
    """The facts of ``recorded`` and ``other`` (two `host_facts`) that differ, in a stable
    order (``cpu.isa`` stands for its hash; a record of before ``cpu.isa``, with ``cpu.flags``
    and ``cpu.flags_sha``, gets its ``cpu.isa`` from its flags); ``decisive``: only the
    `DECISIVE` ones. A fact
    that only one side records counts when the other side records its group (e.g. torch facts
    of a process that had not loaded torch are not compared)."""
    out = []
    recorded, other = _with_isa(recorded), _with_isa(other)
    groups = {k.split(".")[0] for k in recorded} & {k.split(".")[0] for k in other}
    for key in sorted(set(recorded) | set(other)):
        if key in ("cpu.flags_sha", "cpu.isa_sha") or key.split(".")[0] not in groups | {"env"}:
            continue
        old, new = recorded.get(key), other.get(key)
        if old == new or (key == "cpu.flags" and _not_isa(old) == _not_isa(new)):
            continue
        diff = HostDifference(key, old, new)
        if diff.decisive or not decisive:
            out.append(diff)
    return out
