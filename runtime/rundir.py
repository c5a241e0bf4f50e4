"""The run directory: what a run leaves behind.

config.toml       the resolved configuration (re-runnable: ``concord sim config.toml``)
manifest.json     versions, seeds, topology spectra, plan, model fingerprint, machine, host facts
metrics.jsonl     one JSON object per step ("kind": "step") and per evaluation ("kind": "eval")
partition.json    per-peer sample counts and label histograms
calibration.json  the uncontrolled pass's max statistic per phase (constant targets only)
log.jsonl         structured logs (structlog and stdlib loggers as JSON lines, concord.runtime.logs)
checkpoint.pt     everything a step needs: parameters, buffers, algorithm state, RNG state, the
                  step and the run's state (rounds, bytes, control; load with weights_only=True)
summary.json      the final numbers; *.png plots
tensorboard/      TensorBoard event files of the metrics (``tensorboard = true`` only): each finite
                  number of a record as the scalar ``<kind>/<key>`` at its step (`TensorBoardLog`)

One writer for every kind of process: the vectorized engine buffers metrics lines (``flush_every``
= 200), a peer process flushes every line so that a killed peer leaves every completed step behind.
A checkpoint flushes the metrics first, so metrics.jsonl always holds every line up to the
checkpoint's step; a resumed run (``RunWriter(..., resume_after=step)``) drops the lines after it
and appends (TensorBoard hides the events of the dropped steps: ``purge_step``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NotRequired, TypedDict, cast

import numpy as np
import structlog
import torch

from concord.core.comm import CommCounters
from concord.core.config import RunConfig, to_toml
from concord.core.records import (
    JSON,
    CheckpointRunState,
    CounterState,
    Manifest,
    MetricsRecord,
    PeerSummary,
    Record,
    RecordError,
    RunSummary,
)
from concord.errors import ConcordError
from concord.runtime.hostinfo import host_facts
from concord.runtime.lock import DirLock
from concord.runtime.logs import json_default, open_log
from concord.runtime.records import truncate_metrics as truncate_metrics
from concord.version import concord_version

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from concord.core.task import RngState

_FLUSH_EVERY = 200  # metrics lines buffered between writes
CHECKPOINT_VERSION = 2  # 2: with "rng" and "run" (the run's state beyond the tensors)


class CheckpointTable(TypedDict):
    """``checkpoint.pt``'s table (`RunWriter.save_checkpoint`, `load_checkpoint`): tensors and
    plain containers only, loaded with ``torch.load(weights_only=True)``.

    ``version`` (`CHECKPOINT_VERSION`), ``step`` (the last step done, a 0-d tensor), ``params``
    (the replicas' flat parameters, one row each), ``algorithm`` (its `state_dict`), and where
    present ``buffers`` (the replicas' flat buffers), ``rng`` (the task's random state,
    ``ClassificationTask.rng_state``) and ``run`` (the engine's state beyond tensors: a
    `CheckpointRunState` document, read with `run_state_of`). Version-1 checkpoints hold no
    ``rng`` and no ``run``."""

    version: int
    step: torch.Tensor
    params: torch.Tensor
    algorithm: dict[str, torch.Tensor]
    buffers: NotRequired[torch.Tensor]
    rng: NotRequired[RngState]
    run: NotRequired[dict[str, JSON]]


def _json_table(table: Mapping[str, object]) -> dict[str, JSON]:
    """``table`` as JSON values (numpy numbers as Python's, tuples as lists)."""
    plain: dict[str, JSON] = json.loads(json.dumps(table, default=json_default))
    return plain


def default_run_dir(cfg: RunConfig, root: Path = Path("runs")) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    label = cfg.name or f"{cfg.algorithm}-{cfg.topology}-n{cfg.peers}"
    path = root / f"{stamp}-{label}"
    i = 1
    while path.exists():
        i += 1
        path = root / f"{stamp}-{label}-{i}"
    return path


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"
TENSORBOARD_DIR = "tensorboard"
# a record's bookkeeping keys: its x axis and labels, not values to plot
_NOT_SCALARS = frozenset({"step", "kind", "peer", "epoch", "version"})


class TensorBoardUnavailableError(ConcordError, ImportError, RuntimeError):
    """``tensorboard = true`` but the tensorboard package (the ``tensorboard`` extra) is not
    installed. A `ConcordError`, an ImportError and a RuntimeError (as the CLI reports)."""


def _summary_writer_class() -> type[SummaryWriter]:
    """torch's SummaryWriter, imported on first use (it needs the optional tensorboard package)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise TensorBoardUnavailableError(
            "tensorboard = true needs the tensorboard package: "
            f"pip install 'concord[tensorboard]' ({exc})"
        ) from exc
    return SummaryWriter


def tensorboard_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """``<kind>/<key>`` → value of every finite number of a metrics record (booleans, strings,
    lists, tables, None, NaN and ±inf left out; so are ``step``, ``kind``, ``peer``, ``epoch``)."""
    kind = record.get("kind", "metric")
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _NOT_SCALARS or isinstance(value, bool | np.bool_):
            continue
        if isinstance(value, numbers.Real) and math.isfinite(value):
            out[f"{kind}/{key}"] = float(value)
    return out


class TensorBoardLog:
    """``<run dir>/tensorboard``: a `SummaryWriter` fed with the metrics records
    (`tensorboard_scalars`, at the record's ``step``). ``purge_step``: a resumed run's first
    step; TensorBoard hides the events of that step and later ones written before."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        self._writer = _summary_writer_class()(log_dir=str(log_dir), purge_step=purge_step)
        self._dirty = False

    def add(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return  # no x axis
        for tag, value in tensorboard_scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step)
            self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._writer.flush()
            self._dirty = False

    def close(self) -> None:
        self._writer.close()


class RunWriter:
    """A run directory being written: config, metrics lines, the process's log, checkpoints and
    the summary. ``identity`` binds every log line (e.g. ``peer=3``; ``run`` is always bound)."""

    def __init__(
        self,
        run_dir: Path,
        cfg: RunConfig,
        *,
        run: str | None = None,
        flush_every: int = _FLUSH_EVERY,
        resume_after: int | None = None,
        **identity: Any,
    ) -> None:
        """``resume_after``: continue the run in ``run_dir`` whose checkpoint holds this step:
        metrics lines of later steps are dropped (`truncate_metrics`) and new ones appended.
        ``cfg.tensorboard``: the records also go to ``tensorboard/`` (`TensorBoardLog`; raises
        `TensorBoardUnavailableError` before anything is written when the package is missing)."""
        self.dir = run_dir
        self.cfg = cfg
        self.flush_every = max(1, flush_every)
        if cfg.tensorboard:
            _summary_writer_class()  # fail before the directory is touched
        # before anything is written: one writer per directory (`concord.runtime.lock`)
        who = ", ".join(f"{k} {v}" for k, v in identity.items()) or "run"
        self._lock = DirLock(run_dir, who)
        (self.dir / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        metrics = self.dir / "metrics.jsonl"
        if resume_after is not None:
            truncate_metrics(metrics, resume_after)
        mode = "w" if resume_after is None else "a"
        self._metrics: IO[str] = open(metrics, mode, encoding="utf-8")  # noqa: SIM115
        self._pending: list[str] = []
        self._tensorboard: TensorBoardLog | None = None
        if cfg.tensorboard:
            # a rejoining peer resumes after sys.maxsize: nothing to purge
            purge = resume_after + 1 if resume_after is not None and resume_after < 2**62 else None
            self._tensorboard = TensorBoardLog(self.dir / TENSORBOARD_DIR, purge_step=purge)
        self._sink = open_log(
            self.dir / "log.jsonl", run=run or cfg.name or self.dir.name, **identity
        )
        self.log = structlog.get_logger("concord.runtime.rundir")
        if resume_after is None:
            self.log.info("run.start", dir=str(self.dir))
        else:
            self.log.info("run.resume", dir=str(self.dir), after_step=resume_after)

    def write_json(self, name: str, obj: Record | Mapping[str, Any] | Sequence[Any]) -> Path:
        """Replace ``name`` with ``obj`` (a record: its `Record.to_json` document) as indented
        JSON, atomically (written aside, renamed)."""
        body = obj.to_json() if isinstance(obj, Record) else obj
        path = self.dir / name
        tmp = path.with_name(f"{name}.tmp")
        tmp.write_text(json.dumps(body, indent=2, default=json_default) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    def write_manifest(
        self,
        *,
        steps: int,
        steps_per_epoch: int,
        plan: Mapping[str, object],
        topologies: Mapping[str, object],
        fingerprint: str,
        parameters: int,
        device: str,
    ) -> Manifest:
        """``manifest.json`` of a vectorized run: its shape, the versions and the machine (``host``:
        `concord.runtime.hostinfo.host_facts`, the facts that decide bit-equality across hosts)."""
        manifest = Manifest(
            engine="vectorized",
            created=dt.datetime.now(dt.UTC).isoformat(),
            peers=self.cfg.peers,
            steps=steps,
            steps_per_epoch=steps_per_epoch,
            plan=_json_table(plan),
            topologies=_json_table(topologies),
            fingerprint=fingerprint,
            seed=self.cfg.seed,
            algorithm=self.cfg.algorithm,
            topology=self.cfg.topology,
            parameters=parameters,
            device=device,
            concord=concord_version(),
            git_commit=git_commit(),
            python=sys.version.split()[0],
            torch=torch.__version__,
            numpy=np.__version__,
            platform=platform.platform(),
            torch_threads=torch.get_num_threads(),
            host=host_facts(),
        )
        self.write_json("manifest.json", manifest)
        return manifest

    def metric(self, record: MetricsRecord | Mapping[str, Any]) -> None:
        """Append a metrics line (a record's `Record.to_json` document)."""
        if isinstance(record, Record):
            record = record.to_json()
        self._pending.append(json.dumps(record, default=json_default))
        if self._tensorboard is not None:
            self._tensorboard.add(record)
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._metrics.write("\n".join(self._pending) + "\n")
            self._metrics.flush()
            self._pending.clear()
        if self._tensorboard is not None:
            self._tensorboard.flush()

    def save_checkpoint(
        self,
        task: Any,
        algorithm: Any,
        step: int,
        *,
        run_state: CheckpointRunState | None = None,
        keep_previous: bool = False,
    ) -> Path:
        """``checkpoint.pt``: the replicas' parameters, buffers, the algorithm's state and the
        task's RNG state after ``step``, and ``run_state`` (the engine's state beyond tensors,
        stored as its JSON document): a `CheckpointTable`, written
        atomically (a crash mid-write leaves the previous one). The metrics buffered so far are
        flushed first. ``keep_previous``: the one it replaces stays as ``checkpoint.prev.pt`` —
        peers of one run checkpoint the same steps but not at the same instant, so a run killed
        between two checkpoints finds a step every peer holds in one of the two
        (`checkpoint_steps`)."""
        self.flush()
        path = self.dir / "checkpoint.pt"
        state: CheckpointTable = {
            "version": CHECKPOINT_VERSION,
            "step": torch.tensor(step),
            "params": task.x.detach().cpu().clone(),
            "algorithm": {k: v.detach().cpu().clone() for k, v in algorithm.state_dict().items()},
        }
        buffers = task.flat.buffers_flat()
        if buffers is not None:
            state["buffers"] = buffers.detach().cpu().clone()
        rng_state = getattr(task, "rng_state", None)
        if rng_state is not None:
            state["rng"] = rng_state()
        if run_state is not None:
            state["run"] = run_state.to_json()
        tmp = path.with_suffix(".pt.tmp")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.is_file():
            # a second name for the current one first, so that checkpoint.pt exists at every
            # instant (renaming it away left a moment with checkpoint.prev.pt only)
            link = self.dir / (PREVIOUS_CHECKPOINT + ".tmp")
            link.unlink(missing_ok=True)
            try:
                os.link(path, link)
            except OSError:  # a file system without hard links
                shutil.copyfile(path, link)
            link.replace(self.dir / PREVIOUS_CHECKPOINT)
        tmp.replace(path)
        return path

    def close(self) -> None:
        """Close without a summary (a run that never started)."""
        self.flush()
        self._metrics.close()
        self._close_tensorboard()
        self.log.info("run.closed")
        self._sink.close()
        self._lock.release()

    def finish(
        self, summary: RunSummary | PeerSummary | Mapping[str, Any], *, plots: bool = True
    ) -> None:
        """Write summary.json and (``plots``) the run's PNGs
        (`concord.runtime.plots.write_plots`)."""
        self.flush()
        self._metrics.close()
        self._close_tensorboard()
        if isinstance(summary, Record):
            summary = summary.to_json()
        self.write_json("summary.json", summary)
        if plots:
            try:
                from concord.runtime.plots import write_plots

                files = write_plots(self.dir)
                self.log.info("run.plots", files=[p.name for p in files])
            except Exception as exc:  # plots must never lose a finished run's numbers
                self.log.error("run.plots_failed", error=repr(exc))
        self.log.info("run.finish", **{k: v for k, v in summary.items() if k != "run_dir"})
        self._sink.close()
        self._lock.release()

    def _close_tensorboard(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def checkpoint_steps(run_dir: Path) -> dict[int, Path]:
    """step → file, of ``checkpoint.pt`` and ``checkpoint.prev.pt`` in ``run_dir`` (unreadable
    ones left out: a torn file is no checkpoint)."""
    found: dict[int, Path] = {}
    for name in (PREVIOUS_CHECKPOINT, "checkpoint.pt"):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            step = int(load_checkpoint(path)["step"])
        except Exception:  # any failure to read means "not a checkpoint"
            continue
        found[step] = path
    return found


def load_checkpoint(path: Path) -> CheckpointTable:
    """``checkpoint.pt``'s table at ``path``. Safe loading only: tensors and plain containers,
    never arbitrary pickled objects. Raises `RecordError` naming the file and the key when the
    table lacks one of its required tensors."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise RecordError(str(path), "", f"expected a checkpoint table, got {type(state).__name__}")
    for key in ("step", "params"):
        if not isinstance(state.get(key), torch.Tensor):
            raise RecordError(str(path), key, "missing or not a tensor (not a concord checkpoint)")
    return cast(CheckpointTable, state)  # checked: the tensors every reader relies on


def restore_checkpoint(state: CheckpointTable, task: Any, algorithm: Any) -> None:
    """Load a `load_checkpoint` table into ``task`` (parameters, buffers, RNG state) and
    ``algorithm`` (its `state_dict`); the run's state (``state["run"]``) is the engine's."""
    params = state["params"]
    if tuple(params.shape) != tuple(task.x.shape):
        raise ValueError(
            f"checkpoint parameters have shape {tuple(params.shape)}; this run's are "
            f"{tuple(task.x.shape)} (another model or number of replicas?)"
        )
    with torch.no_grad():
        task.x.copy_(params.to(task.x.device, task.x.dtype))
        if "buffers" in state:
            task.flat.load_buffers_flat(state["buffers"].to(task.x.device))
    device = task.x.device
    algorithm.load_state_dict({k: v.to(device) for k, v in state["algorithm"].items()})
    if "rng" in state:
        task.load_rng_state(state["rng"])


def run_state_of(state: CheckpointTable, path: Path) -> CheckpointRunState | None:
    """The run state of a `load_checkpoint` table read from ``path`` (None: it holds none,
    a version-1 checkpoint). Raises `RecordError` naming the field that does not match."""
    run = state.get("run")
    return None if run is None else CheckpointRunState.from_json(run, where=f"{path} run state")


def counters_state(c: CommCounters) -> CounterState:
    """A `Comm`'s byte counters (for a checkpoint's run state)."""
    return CounterState(
        bytes_raw=c.bytes_raw,
        bytes_wire=c.bytes_wire,
        messages=c.messages,
        rounds=c.rounds,
        edges=[(s, d, r, w) for (s, d), (r, w) in sorted(c.edges.items())],
    )


def load_counters(c: CommCounters, d: CounterState) -> None:
    """Restore `counters_state`."""
    c.bytes_raw, c.bytes_wire = d.bytes_raw, d.bytes_wire
    c.messages, c.rounds = d.messages, d.rounds
    c.edges = {(s, t): [r, w] for s, t, r, w in d.edges}
