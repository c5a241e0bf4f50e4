"""The run directory: what a run leaves behind.

config.toml       the resolved configuration (re-runnable: ``concord sim config.toml``)
manifest.json     versions, seeds, topology spectra, plan, model fingerprint, machine
metrics.jsonl     one JSON object per step ("kind": "step") and per evaluation ("kind": "eval")
partition.json    per-peer sample counts and label histograms
calibration.json  the uncontrolled pass's max statistic per phase (constant targets only)
log.jsonl         structured logs (structlog and stdlib loggers as JSON lines, concord.runtime.logs)
checkpoint.pt     parameters, buffers and algorithm state (load with weights_only=True)
summary.json      the final numbers; *.png plots

One writer for every kind of process: the vectorized engine buffers metrics lines (``flush_every``
= 200), a peer process flushes every line so that a killed peer leaves every completed step behind.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import numpy as np
import structlog
import torch

from concord.core.config import RunConfig, to_toml
from concord.runtime.logs import json_default, open_log
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
    """A run directory being written: config, metrics lines, the process's log, checkpoints and
    the summary. ``identity`` binds every log line (e.g. ``peer=3``; ``run`` is always bound)."""

    def __init__(
        self,
        run_dir: Path,
        cfg: RunConfig,
        *,
        run: str | None = None,
        flush_every: int = _FLUSH_EVERY,
        **identity: Any,
    ) -> None:
        self.dir = run_dir
        self.cfg = cfg
        self.flush_every = max(1, flush_every)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        self._metrics: IO[str] = open(self.dir / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._pending: list[str] = []
        self._sink = open_log(
            self.dir / "log.jsonl", run=run or cfg.name or self.dir.name, **identity
        )
        self.log = structlog.get_logger("concord.runtime.rundir")
        self.log.info("run.start", dir=str(self.dir))

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(obj, indent=2, default=json_default) + "\n", encoding="utf-8")
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
        self._pending.append(json.dumps(record, default=json_default))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._metrics.write("\n".join(self._pending) + "\n")
            self._metrics.flush()
            self._pending.clear()

    def save_checkpoint(self, task: Any, algorithm: Any, step: int) -> Path:
        """``checkpoint.pt``: the replicas' parameters, buffers and the algorithm's state after
        ``step`` steps, written atomically (a crash mid-write leaves the previous one)."""
        path = self.dir / "checkpoint.pt"
        state = {
            "step": torch.tensor(step),
            "params": task.x.detach().cpu(),
            "algorithm": {k: v.detach().cpu() for k, v in algorithm.state_dict().items()},
        }
        buffers = task.flat.buffers_flat()
        if buffers is not None:
            state["buffers"] = buffers.detach().cpu()
        tmp = path.with_suffix(".pt.tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        return path

    def close(self) -> None:
        """Close without a summary (a run that never started)."""
        self.flush()
        self._metrics.close()
        self.log.info("run.closed")
        self._sink.close()

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
        self._sink.close()


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Safe loading only: tensors and plain containers, never arbitrary pickled objects."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state
