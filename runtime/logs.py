"""One logging set-up for every process of a run: JSON lines in the run directory.

`open_log` points structlog — every ``structlog.get_logger(__name__)`` of the process — and the
stdlib loggers of the libraries underneath (grpc, asyncio, the embedded MQTT broker, …) at one
``log.jsonl``-style file. Every line is one JSON object with ``timestamp`` (ISO, UTC), ``level``,
``event``, ``logger`` for stdlib records, the identity the process binds (``run`` plus ``peer`` or
``role``) and whatever the thread has bound with ``structlog.contextvars`` (``step``, ``round``).

Torch-free (the orchestrator uses it). `LogSink.close` restores the logging configuration that was
in force before, so a process that runs several runs in turn (a sweep worker, the CLI running a
reference run after the main one) never writes into a closed file.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import structlog

__all__ = ["STDLIB_LEVELS", "LogSink", "json_default", "open_log"]

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

    def __init__(self, file: IO[str]) -> None:
        self.file = file
        self.lock = threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            if not self.file.closed:
                self.file.write(line + "\n")
                self.file.flush()


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


class LogSink:
    """The process's log while a run is going; `close` (or leaving the ``with``) restores the
    previous configuration and closes the file."""

    def __init__(self, path: Path, identity: Mapping[str, Any]) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lines = _Lines(self._file)
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


def open_log(path: Path, **identity: Any) -> LogSink:
    """Route this process's logs to ``path`` (appending), every line bound with ``identity``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return LogSink(path, identity)
