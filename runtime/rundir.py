"""The run directory: what a run leaves behind.

config.toml       the resolved configuration (re-runnable: ``concord sim config.toml``)
manifest.json     versions, seeds, topology spectra, plan, model fingerprint, machine
metrics.jsonl     one JSON object per step ("kind": "step") and per evaluation ("kind": "eval")
partition.json    per-peer sample counts and label histograms
calibration.json  the uncontrolled pass's max statistic per phase (constant targets only)
log.jsonl         structured logs (structlog, JSON lines)
checkpoint.pt     final parameters, buffers and optimizer state (load with weights_only=True)
summary.json      the final numbers; *.png plots
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import structlog
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from concord.core.config import RunConfig, to_toml
from concord.version import concord_version

_FLUSH_EVERY = 200  # metrics lines buffered between writes


def default_run_dir(cfg: RunConfig, root: Path = Path("runs")) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    label = cfg.name or f"{cfg.algorithm}-{cfg.topology}-n{cfg.peers}"
    path = root / f"{stamp}-{label}"
    i = 1
    while path.exists():
        i += 1
        path = root / f"{stamp}-{label}-{i}"
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer | np.floating):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


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


class RunWriter:
    def __init__(self, run_dir: Path, cfg: RunConfig) -> None:
        self.dir = run_dir
        self.cfg = cfg
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        self._metrics: IO[str] = open(self.dir / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._pending: list[str] = []
        self._log_file: IO[str] = open(self.dir / "log.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.log = structlog.wrap_logger(
            structlog.WriteLogger(self._log_file),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(default=_json_default),
            ],
        ).bind(run=cfg.name or self.dir.name, engine=cfg.engine)
        self.log.info("run.start", dir=str(self.dir))

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n", encoding="utf-8")
        return path

    def write_manifest(self, **fields: Any) -> None:
        manifest = {
            "created": dt.datetime.now(dt.UTC).isoformat(),
            "concord": concord_version(),
            "git_commit": git_commit(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "numpy": np.__version__,
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            "seed": self.cfg.seed,
            "peers": self.cfg.peers,
            "algorithm": self.cfg.algorithm,
            "topology": self.cfg.topology,
            **fields,
        }
        self.write_json("manifest.json", manifest)

    def metric(self, record: dict[str, Any]) -> None:
        self._pending.append(json.dumps(record, default=_json_default))
        if len(self._pending) >= _FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._metrics.write("\n".join(self._pending) + "\n")
            self._metrics.flush()
            self._pending.clear()

    def save_checkpoint(self, task: Any, algorithm: Any, step: int) -> Path:
        path = self.dir / "checkpoint.pt"
        state = {
            "step": torch.tensor(step),
            "params": task.x.detach().cpu(),
            "algorithm": {k: v.detach().cpu() for k, v in algorithm.state_dict().items()},
        }
        buffers = task.flat.buffers_flat()
        if buffers is not None:
            state["buffers"] = buffers.detach().cpu()
        torch.save(state, path)
        return path

    def progress(self, total: int, *, enabled: bool) -> _Bar:
        return _Bar(total, enabled=enabled)

    def finish(self, summary: dict[str, Any], *, plots: bool = True) -> None:
        """Write summary.json and (``plots``) the run's PNGs
        (`concord.runtime.plots.write_plots`)."""
        self.flush()
        self._metrics.close()
        self.write_json("summary.json", summary)
        if plots:
            try:
                from concord.runtime.plots import write_plots

                files = write_plots(self.dir)
                self.log.info("run.plots", files=[p.name for p in files])
            except Exception as exc:  # plots must never lose a finished run's numbers
                self.log.error("run.plots_failed", error=repr(exc))
        self.log.info("run.finish", **{k: v for k, v in summary.items() if k != "run_dir"})
        self._log_file.close()


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Safe loading only: tensors and plain containers, never arbitrary pickled objects."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


class _Bar:
    """A rich progress bar with the numbers a user watches: accuracy, Θ vs target, rounds."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> _Bar:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, info="")
        return self

    def update(self, rec: dict[str, Any], last_eval: dict[str, float]) -> None:
        if self._progress is None:
            return
        step = rec["step"]
        if step % 10 and step != self.total - 1:
            self._progress.update(self._task, completed=step + 1)
            return
        parts = [f"ep {rec['epoch']:.1f}", f"loss {rec['loss']:.3f}"]
        if "acc_avg_model" in last_eval:
            parts.append(f"acc {100 * last_eval['acc_avg_model']:.1f}%")
        if rec.get("theta") is not None:
            t = rec.get("target")
            parts.append(f"Θ {rec['theta']:.3g}" + (f"/{t:.3g}" if t is not None else ""))
        parts.append(f"rounds {rec['rounds']}")
        self._progress.update(self._task, completed=step + 1, info="  ".join(parts))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
