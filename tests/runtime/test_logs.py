"""`concord.runtime.logs`: one JSON log per process, stdlib loggers included, restored on close."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
import structlog

from concord.runtime.logs import Console, default_console, open_log, set_console_format


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_structlog_and_stdlib_loggers_share_one_json_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with open_log(path, run="r1", peer=3):
        structlog.contextvars.bind_contextvars(step=7)
        try:
            structlog.get_logger("concord.test").info("hello", value=1.5)
            logging.getLogger("grpc._cython").warning("stream %s reset", "abc")
            logging.getLogger("asyncio").info("chatter below the kept level")
        finally:
            structlog.contextvars.unbind_contextvars("step")
    got = lines(path)
    assert [g["event"] for g in got] == ["hello", "stream abc reset"]
    ours, grpc = got
    assert ours["run"] == "r1"
    assert ours["peer"] == 3
    assert ours["step"] == 7
    assert ours["level"] == "info"
    assert ours["value"] == 1.5
    assert "timestamp" in ours
    assert grpc["logger"] == "grpc._cython"
    assert grpc["level"] == "warning"
    assert grpc["run"] == "r1"
    assert grpc["peer"] == 3
    assert grpc["step"] == 7


def test_close_restores_the_previous_configuration(tmp_path: Path) -> None:
    before = structlog.get_config()["logger_factory"]
    handlers = list(logging.getLogger().handlers)
    outer = open_log(tmp_path / "outer.jsonl", role="launcher")
    inner = open_log(tmp_path / "inner.jsonl", run="ref")
    structlog.get_logger("t").info("to-inner")
    inner.close()
    structlog.get_logger("t").info("to-outer")  # a closed run's file is never written again
    logging.getLogger("amqtt").error("broker trouble")
    outer.close()
    assert structlog.get_config()["logger_factory"] is before
    assert logging.getLogger().handlers == handlers
    assert [g["event"] for g in lines(tmp_path / "inner.jsonl")] == ["to-inner"]
    outer_events = [g["event"] for g in lines(tmp_path / "outer.jsonl")]
    assert outer_events == ["to-outer", "broker trouble"]


def test_numpy_and_path_values_are_logged(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "log.jsonl"
    with open_log(path, run="r"):
        structlog.get_logger("t").info("values", a=np.float32(0.5), b=np.arange(3), p=tmp_path)
    (got,) = lines(path)
    assert got["a"] == 0.5
    assert got["b"] == [0, 1, 2]
    assert got["p"] == str(tmp_path)


def test_the_console_mirrors_info_and_above_to_stderr(tmp_path: Path) -> None:
    """What `docker compose logs` and `kubectl logs` show: one readable line per event of INFO
    and above (the process's identity once, then the event and its fields), or the JSON line
    of log.jsonl itself."""
    text, as_json = io.StringIO(), io.StringIO()
    for stream, fmt in ((text, "text"), (as_json, "json")):
        path = tmp_path / f"{fmt}.jsonl"
        with open_log(path, console=Console(fmt, stream=stream), run="r1", peer=3):
            log = structlog.get_logger("concord.test")
            log.debug("too.chatty")
            log.info("peer.progress", step=12, accuracy=0.5, note="two words")
            logging.getLogger("grpc").warning("stream reset")
    shown = text.getvalue().splitlines()
    assert len(shown) == 2, shown  # the debug line stays in the file only
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3}  INFO     peer 3  peer\.progress  step=12 accuracy=0\.5 "
        r'note="two words"',
        shown[0],
    ), shown[0]
    assert "WARNING" in shown[1]
    assert "stream reset" in shown[1]
    file_lines = (tmp_path / "json.jsonl").read_text().splitlines()
    assert as_json.getvalue().splitlines() == [
        line for line in file_lines if json.loads(line)["level"] != "debug"
    ]


def test_the_console_is_off_unless_the_process_asks() -> None:
    """A CLI's own output (a progress bar) stays clean: `open_log` mirrors to stderr only after
    a long-running command asked (`concord peer|orchestrator --log-format`)."""
    assert default_console() is None
    try:
        set_console_format("json")
        console = default_console()
        assert console is not None
        assert console.fmt == "json"
        with pytest.raises(ValueError, match="log format 'xml': one of text, json, none"):
            set_console_format("xml")
    finally:
        set_console_format("none")
    assert default_console() is None
