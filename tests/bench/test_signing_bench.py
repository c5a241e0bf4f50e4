"""``bench/signing.py --quick`` runs its real path (a PKI, an embedded broker, signed and unsigned
buses) and reports every figure; the bench itself fails when a message is lost or refused."""

from __future__ import annotations

import pytest

from bench.signing import main


def test_quick_signing_bench_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    result = main(["--quick"])
    keys = {"sign_us", "verify_us", "envelope_bytes", "message_bytes"}
    keys |= {"rtt_ms_unsigned", "rtt_ms_signed", "rtt_ratio"}
    assert set(result) == keys
    assert all(v > 0 for v in result.values())
    # the envelope carries the message, the sender's certificate (DER) and a signature
    assert result["envelope_bytes"] > result["message_bytes"] + 400
    assert result["rtt_ratio"] == pytest.approx(result["rtt_ms_signed"] / result["rtt_ms_unsigned"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("{")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--pings", "0"])
