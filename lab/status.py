"""``concord status RUN_DIR|BROKER``: a live view of a running run, from its control plane.

It is an ordinary read-only MQTT client of the run (the ``observer`` identity when the broker asks
for credentials — not ``monitor``, which `concord sim`'s own live view holds; it verifies signed
messages when the run has a PKI, never signs): the retained
plan, presence and per-peer status arrive at once, heartbeats every second, step metrics and
decisions as the peers make them. `RunView` folds them into one table — every peer's state,
step, phase, rounds, θ, loss and when it was last heard, with stragglers flagged — and the run's
progress, Θ against its target and the orchestrator's presence. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from concord.core.records import peer_accuracy
from concord.protos.control_plane import (
    Decision,
    Heartbeat,
    Message,
    Metrics,
    Plan,
    Presence,
    Status,
    Topics,
)

__all__ = ["RunView", "Target", "resolve_target", "watch"]

# a peer this many steps behind the newest one, or silent for this many heartbeats, is flagged
STRAGGLER_STEPS = 5
SILENT_HEARTBEATS = 3.0
_KINDS = ["plan", "orchestrator", "status", "heartbeat", "metrics", "decision"]


@dataclass
class PeerRow:
    state: str = "—"
    step: int | None = None
    stage: str = ""
    heard: float | None = None  # time.monotonic() of the last message from it
    values: dict[str, float] = field(default_factory=dict)  # its latest step metrics
    accuracy: float | None = None  # its latest evaluation


@dataclass
class RunView:
    """What the control plane has said about one run so far."""

    run: str
    heartbeat: float = 1.0  # seconds between peer heartbeats (the run's orchestrator.heartbeat)
    total_steps: int | None = None
    peers_planned: int | None = None
    presence: str = "unknown"
    presence_reason: str = ""
    decision: Decision | None = None
    peers: dict[int, PeerRow] = field(default_factory=dict)
    messages: int = 0
    started: float = field(default_factory=time.monotonic)

    def on_message(self, kind: str, peer: int | None, message: Message) -> None:
        now = time.monotonic()
        self.messages += 1
        if isinstance(message, Plan):
            self.total_steps = message.total_steps
            return
        if isinstance(message, Presence):
            self.presence, self.presence_reason = message.state, message.reason
            return
        if isinstance(message, Decision):
            self.decision = message
            return
        if peer is None:
            return
        row = self.peers.setdefault(peer, PeerRow())
        row.heard = now
        if isinstance(message, Status):
            row.state, row.stage = message.state, message.stage
            row.step = max(row.step or 0, message.step)
        elif isinstance(message, Heartbeat):
            row.step = max(row.step or 0, message.step)
        elif isinstance(message, Metrics):
            if message.event == "eval":
                row.accuracy = peer_accuracy(message.values)  # the peer's name, old or new
            else:
                row.step = max(row.step or 0, message.step)
                row.values = dict(message.values)

    def stragglers(self, now: float | None = None) -> dict[int, str]:
        """peer → why it is flagged: far behind the newest step, or silent."""
        now = time.monotonic() if now is None else now
        newest = max((r.step for r in self.peers.values() if r.step is not None), default=0)
        out: dict[int, str] = {}
        for i, r in self.peers.items():
            if r.state in ("done", "failed", "offline"):
                continue
            silent = None if r.heard is None else now - r.heard
            if silent is not None and silent > SILENT_HEARTBEATS * self.heartbeat:
                out[i] = f"silent {silent:.0f} s"
            elif r.step is not None and newest - r.step > STRAGGLER_STEPS:
                out[i] = f"{newest - r.step} behind"
        return out

    def snapshot(self) -> dict[str, Any]:
        """The view as plain data (``--json``)."""
        now = time.monotonic()
        flags = self.stragglers(now)
        d = self.decision
        return {
            "run": self.run,
            "orchestrator": self.presence,
            "total_steps": self.total_steps,
            "step": self.step,
            "theta": None if d is None else d.statistic,
            "target": None if d is None else d.target,
            "peers": {
                str(i): {
                    "state": r.state,
                    "step": r.step,
                    "phase": _int(r.values.get("phase")),
                    "rounds": _int(r.values.get("rounds")),
                    "theta": r.values.get("theta"),
                    "loss": r.values.get("loss"),
                    "accuracy": r.accuracy,
                    "heard_seconds_ago": None if r.heard is None else round(now - r.heard, 2),
                    "straggler": flags.get(i),
                }
                for i, r in sorted(self.peers.items())
            },
        }

    @property
    def step(self) -> int | None:
        steps = [r.step for r in self.peers.values() if r.step is not None]
        return min(steps) if steps else None

    def render(self) -> Group:
        now = time.monotonic()
        flags = self.stragglers(now)
        head = Text.assemble(("run ", "dim"), (self.run, "bold"), ("  orchestrator ", "dim"))
        head.append(self.presence, style="green" if self.presence == "online" else "yellow")
        if self.presence_reason:
            head.append(f" ({self.presence_reason})", style="dim")
        if self.step is not None:
            total = f"/{self.total_steps}" if self.total_steps else ""
            pct = f" ({100 * (self.step + 1) / self.total_steps:.0f} %)" if self.total_steps else ""
            head.append(f"  step {self.step + 1}{total}{pct}")
        d = self.decision
        if d is not None and d.statistic is not None:
            target = f" / target {d.target:.3g}" if d.target is not None else ""
            head.append(f"  Θ {d.statistic:.3g}{target}")
        if flags:
            head.append(f"  {len(flags)} straggler(s)", style="bold red")
        table = Table(
            box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, collapse_padding=True
        )
        for name in ("peer", "state", "step", "phase", "rounds", "θ", "loss", "acc", "heard"):
            table.add_column(name, justify="left" if name == "state" else "right", no_wrap=True)
        table.add_column("flag", justify="left", no_wrap=True)
        for i, r in sorted(self.peers.items()):
            heard = "—" if r.heard is None else f"{now - r.heard:.1f} s"
            table.add_row(
                str(i),
                r.state,
                "—" if r.step is None else str(r.step),
                _fmt(r.values.get("phase"), "d"),
                _fmt(r.values.get("rounds"), "d"),
                _fmt(r.values.get("theta"), ".3g"),
                _fmt(r.values.get("loss"), ".3f"),
                "—" if r.accuracy is None else f"{100 * r.accuracy:.1f}%",
                heard,
                Text(flags.get(i, ""), style="bold red"),
            )
        if not self.peers:
            table.add_row("—", "no peer heard yet", *[""] * 8)
        return Group(head, table)


def _int(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else int(value)


def _fmt(value: float | None, spec: str) -> str:
    if value is None or math.isnan(value):
        return "—"
    return format(int(value), spec) if spec == "d" else format(value, spec)


@dataclass(frozen=True)
class Target:
    """Where the run's control plane is: broker URL, run id, and the config (credentials,
    signing, heartbeat) when one is known."""

    broker: str
    run: str
    config: Any = None  # RunConfig | None


def resolve_target(
    target: str, run_id: str | None, config: Path | None, *, wait: float = 0.0
) -> Target:
    """``target``: a run directory (its ``orchestrator.json`` names the broker and run id, its
    ``config.toml`` the credentials) or a broker URL with ``run_id``. ``wait``: seconds to wait
    for a run directory's ``orchestrator.json`` (a run being started). ValueError saying what
    is missing."""
    from concord.core.config import load_config

    cfg = load_config(config, []) if config is not None else None
    if "://" in target:
        rid = run_id or (cfg.name if cfg is not None else None)
        if not rid:
            raise ValueError(
                f"{target}: which run? pass --run-id (the orchestrator logs it and writes it to "
                "orchestrator.json) or --config with the run's name"
            )
        return Target(target, rid, cfg)
    run_dir = Path(target)
    info_path = run_dir / "orchestrator.json"
    end = time.monotonic() + wait
    while not info_path.is_file() and time.monotonic() < end:
        time.sleep(0.2)
    if not info_path.is_file():
        hint = (
            " (a run of the vectorized engine has no control plane)"
            if (run_dir / "summary.json").is_file()
            else ""
        )
        raise ValueError(
            f"{target}: no orchestrator.json here{hint}; give a run directory of the processes "
            "engine (or an orchestrator's --out), or mqtt[s]://HOST:PORT with --run-id"
        )
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        broker, rid = str(info["broker"]), str(run_id or info["run"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{info_path}: unreadable ({exc})") from None
    if cfg is None and (run_dir / "config.toml").is_file():
        cfg = load_config(run_dir / "config.toml", [], environ={})
    return Target(broker, rid, cfg)


async def watch(
    target: Target,
    *,
    seconds: float | None,
    interval: float,
    live: bool,
    as_json: bool,
    identity: str = "observer",
) -> RunView:
    """Follow ``target``: ``live`` redraws the view every ``interval`` seconds until Ctrl-C
    (or ``seconds``); otherwise listen ``seconds`` and return the view for one print."""
    from rich.console import Console
    from rich.live import Live

    from concord.orchestrator.broker import embedded_broker_secured
    from concord.protos.mqtt import BrokerAuth, Bus
    from concord.protos.reach import probe_broker
    from concord.protos.signing import signing_for

    # the MQTT client's own log lines (connected, reconnecting) would tear the view apart
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    cfg = target.config
    auth = signing = None
    view = RunView(target.run)
    if cfg is not None:
        o = cfg.orchestrator
        view.heartbeat = o.heartbeat
        view.peers_planned = cfg.peers
        if o.broker or embedded_broker_secured(o):
            auth = BrokerAuth.from_config(o, identity)
        signing = signing_for(cfg, "monitor", target.run)  # verifies, never signs
    await asyncio.to_thread(probe_broker, target.broker, auth, identifier="status")
    async with Bus(
        target.broker,
        f"status-{target.run}",
        Topics(target.run),
        subscribe=_KINDS,
        handler=view.on_message,
        auth=auth,
        signing=signing,
    ):
        end = None if seconds is None else time.monotonic() + seconds
        if not live:
            await asyncio.sleep(seconds or 0.0)
            return view
        console = Console()
        with Live(view.render(), console=console, refresh_per_second=4, transient=False) as shown:
            while end is None or time.monotonic() < end:
                await asyncio.sleep(interval)
                shown.update(view.render() if not as_json else Text(json.dumps(view.snapshot())))
                if view.presence == "offline" and view.presence_reason == "run finished":
                    break
    return view
