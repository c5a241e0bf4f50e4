"""``concord report verify`` tells "corpus differs" from another host: a dataset read from the
host's own files (``pystdlib-chars``: the running interpreter's standard library) records its
corpus hashes as ``data.pystdlib-chars.*`` host facts (run manifests, and a pystdlib report's
``preset.json``); a re-run whose worker read another corpus is blamed on the corpus, before
the host and the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from concord.core.data import pystdlib
from concord.lab.verify.diagnose import CodeState, HostState, compare_hosts
from concord.lab.verify.rerun import _verdict_lines, cause_of, with_corpus
from concord.runtime.hostinfo import CORPUS_DECISIVE, DECISIVE, host_facts

KEY = "data.pystdlib-chars.corpus_sha256"


def _stdlib(root: Path, extra: str = "") -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("import os\n" * 20 + extra)
    (root / "mod.py").write_text("x = 1\n" * 30)
    return root


def test_a_read_corpus_becomes_host_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pystdlib, "_LOADED", {})
    assert not any(k.startswith("data.") for k in host_facts(cpuinfo=""))  # nothing read yet
    corpus = pystdlib.read_corpus(_stdlib(tmp_path / "a"))
    facts = host_facts(cpuinfo="")
    assert facts[KEY] == corpus.corpus_sha256
    assert facts["data.pystdlib-chars.files_sha256"] == corpus.files_sha256
    assert facts["data.pystdlib-chars.files"] == 2
    assert set(CORPUS_DECISIVE) <= set(DECISIVE)
    other = pystdlib.read_corpus(_stdlib(tmp_path / "b", extra="y = 2\n"))  # one byte changed
    assert host_facts(cpuinfo="")[KEY] == other.corpus_sha256 != corpus.corpus_sha256
    # the file list is the same: only the content hash tells them apart
    assert other.files_sha256 == corpus.files_sha256


def _env(**host: object) -> dict[str, object]:
    return {"torch": "2", "cpu": "x", "threads": 1, "host": {"numpy.version": "1", **host}}


def test_another_corpus_is_its_own_cause_before_host_and_code() -> None:
    recorded = _env(**{KEY: "aaa"})
    state = compare_hosts(recorded, _env(**{KEY: "bbb"}))
    assert state.corpus == (f"{KEY} aaa → bbb",)
    assert state.describe() == f"corpus differs: {KEY} aaa → bbb; host: same"
    for code in ("same", "differs", "unknown"):
        assert cause_of(state, CodeState(code, "c" * 40, "recorded")) == "corpus"
    both = compare_hosts(recorded, _env(**{KEY: "bbb", "numpy.version": "2"}))
    assert both.describe().startswith(f"corpus differs: {KEY} aaa → bbb; host differs too: ")
    verdict = _verdict_lines("run", ["accuracy"], state, CodeState("same", "c" * 40, "x"))
    assert "the cell trained on other data" in verdict
    assert "host is the likely reason" not in verdict


def test_the_same_corpus_or_an_unrecorded_one_is_no_corpus_cause() -> None:
    same = compare_hosts(_env(**{KEY: "aaa"}), _env(**{KEY: "aaa"}))
    assert (same.state, same.corpus) == ("same", ())
    # a report of another dataset records no data.* facts: a re-run's are not compared
    old = compare_hosts(_env(), _env(**{KEY: "bbb"}))
    assert (old.state, old.corpus) == ("same", ())
    assert cause_of(HostState("differs", ("numpy.version 1 → 2",)), CodeState("same")) == "host"


def test_the_rerun_takes_the_corpus_its_worker_recorded(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "cell"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"host": {KEY: "bbb", "cpu.isa_sha": "zzz"}}))
    here = with_corpus(_env(), run)
    assert here["host"] == {"numpy.version": "1", KEY: "bbb"}  # only data.* facts are taken
    assert with_corpus(_env(), tmp_path / "missing") == _env()
