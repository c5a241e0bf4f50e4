"""One logging set-up for every process of a run: JSON lines in the run directory.

`open_log` points structlog — every ``structlog.get_logger(__name__)`` of the process — and the
stdlib loggers of the libraries underneath (grpc, asyncio, the embedded MQTT broker, …) at one
``log.jsonl``-style file. Every line is one JSON object with ``timestamp`` (ISO, UTC), ``level``,
``event``, ``logger`` for stdlib records, the identity the process binds (``run`` plus ``peer`` or
``role``) and whatever the thread has bound with ``structlog.contextvars`` (``step``, ``round``).
A `Console` mirrors the events of INFO and above to stderr — human-readable lines or the same
JSON — for the operators' tools (`concord peer` and `concord orchestrator` turn it on:
``--log-format``).

Torch-free (the orchestrator uses it). `LogSink.close` restores the logging configuration that was
in force before, so a process that runs several runs in turn (a sweep worker, the CLI running a
reference run after the main one) never writes into a closed file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import structlog

__all__ = [
    "LOG_FORMATS",
    "STDLIB_LEVELS",
    "Console",
    "LogSink",
    "default_console",
    "json_default",
    "open_log",
    "set_console_format",
]

# stdlib loggers routed into the run's log, and the level each is kept at (their DEBUG and INFO
# are per-call chatter: connection attempts, keep-alives, broker sessions)
STDLIB_LEVELS: Mapping[str, int] = {
    "": logging.WARNING,
    "asyncio": logging.WARNING,
    "grpc": logging.WARNING,
    "amqtt": logging.WARNING,
    "transitions": logging.WARNING,
}


def json_default(obj: Any) -> Any:
    """JSON for what log lines and records carry besides plain values: numpy and torch scalars
    and arrays (anything with ``tolist``), paths."""
    if isinstance(obj, Path):
        return str(obj)
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class _Lines:
    """The log file, written a whole line at a time from any thread."""

    def __init__(self, file: IO[str], console: Console | None = None) -> None:
        self.file = file
        self.console = console
        self.lock = threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            if not self.file.closed:
                self.file.write(line + "\n")
                self.file.flush()
        if self.console is not None:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": line}
            self.console.emit(event, line)


class _LineLogger:
    """The structlog logger: every level writes the rendered line."""

    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def msg(self, message: str) -> None:
        self._lines.write(message)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


class _StdlibHandler(logging.Handler):
    """Stdlib records as JSON lines in the same file, with the same identity fields."""

    def __init__(self, lines: _Lines, identity: Mapping[str, Any]) -> None:
        super().__init__()
        self._lines = lines
        self._identity = dict(identity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event: dict[str, Any] = {
                **self._identity,
                **structlog.contextvars.get_contextvars(),
                "event": record.getMessage(),
                "logger": record.name,
                "level": record.levelname.lower(),
                "timestamp": structlog.processors.TimeStamper(fmt="iso", utc=True)(None, "", {})[
                    "timestamp"
                ],
            }
            if record.exc_info:
                event["exception"] = logging.Formatter().formatException(record.exc_info)
            self._lines.write(json.dumps(event, default=json_default))
        except Exception:  # a log line must never take the process down
            self.handleError(record)


class Console:
    """The same lines on the process's stderr, where `docker compose logs`, `kubectl logs` and
    Slurm's output files look: ``text`` — one human-readable line per event (time, level, who,
    event, its fields) — or ``json`` — the log.jsonl line itself. Events below ``level`` (INFO)
    stay in the file only."""

    # the identity every line of the file carries; the console line names it once, up front
    _WHO = ("role", "peer")
    _QUIET = ("timestamp", "level", "event", "run", "logger", *_WHO)

    def __init__(self, fmt: str, level: int = logging.INFO, stream: IO[str] | None = None) -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r}: one of {', '.join(LOG_FORMATS)}")
        self.fmt = fmt
        self.level = level
        self.stream = stream
        self.lock = threading.Lock()

    def emit(self, event: Mapping[str, Any], line: str) -> None:
        """Write ``event`` (rendered as the file's ``line``) if its level is high enough."""
        if self.fmt == "none":
            return
        level = logging.getLevelName(str(event.get("level", "info")).upper())
        if isinstance(level, int) and level < self.level:
            return
        text = line if self.fmt == "json" else self.text(event)
        stream = self.stream or sys.stderr
        with self.lock, contextlib.suppress(OSError, ValueError):  # a closed or full stderr
            stream.write(text + "\n")
            stream.flush()

    def text(self, event: Mapping[str, Any]) -> str:
        ts = str(event.get("timestamp", ""))
        clock = ts[11:23] if len(ts) >= 23 else ts  # HH:MM:SS.mmm of the ISO time, UTC
        who = " ".join(
            f"{event[k]}" if k == "role" else f"{k} {event[k]}" for k in self._WHO if k in event
        )
        fields = " ".join(
            f"{k}={_short(v)}"
            for k, v in event.items()
            if k not in self._QUIET and k != "exception"
        )
        parts = [
            clock,
            f"{str(event.get('level', 'info')).upper():<7}",
            who,
            str(event.get("event")),
        ]
        out = "  ".join(p for p in parts if p) + (f"  {fields}" if fields else "")
        if "exception" in event:
            out += "\n" + str(event["exception"]).rstrip()
        return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=json_default)
    if isinstance(value, str) and (" " in text or not text):
        text = json.dumps(text)
    return text if len(text) <= 200 else text[:197] + "..."


LOG_FORMATS = ("text", "json", "none")

# the format of the console `open_log` mirrors to by default, in this process only: "none"
# unless a long-running command asks (`set_console_format`) — a CLI's own output, a progress
# bar, stays clean, and the processes a command starts choose for themselves
_console_format = "none"


def set_console_format(fmt: str) -> None:
    """Mirror this process's logs to stderr as ``fmt`` (text, json or none) from now on."""
    global _console_format
    Console(fmt)  # validates
    _console_format = fmt


def default_console() -> Console | None:
    """The console `open_log` mirrors to unless told otherwise (`set_console_format`)."""
    return None if _console_format == "none" else Console(_console_format)


class LogSink:
    """The process's log while a run is going; `close` (or leaving the ``with``) restores the
    previous configuration and closes the file. ``console``: the same events on stderr too."""

    def __init__(
        self, path: Path, identity: Mapping[str, Any], console: Console | None = None
    ) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lines = _Lines(self._file, console)
        self._previous = structlog.get_config()
        fixed = dict(identity)

        def bind_identity(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
            for key, value in fixed.items():
                event.setdefault(key, value)
            return event

        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                bind_identity,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(default=json_default),
            ],
            logger_factory=lambda *_: _LineLogger(self._lines),
            cache_logger_on_first_use=False,
        )
        self._handler = _StdlibHandler(self._lines, fixed)
        self._levels: dict[str, int] = {}
        for name, level in STDLIB_LEVELS.items():
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(level)
        logging.getLogger().addHandler(self._handler)
        self.log = structlog.get_logger("concord.runtime")

    def close(self) -> None:
        root = logging.getLogger()
        if self._handler in root.handlers:
            root.removeHandler(self._handler)
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)
            structlog.configure(**self._previous)
        with self._lines.lock:
            self._file.close()

    def __enter__(self) -> LogSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_log(path: Path, *, console: Console | None = None, **identity: Any) -> LogSink:
    """Route this process's logs to ``path`` (appending), every line bound with ``identity``;
    and to stderr as ``console`` says (default: `default_console`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return LogSink(path, identity, console if console is not None else default_console())
