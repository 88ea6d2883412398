"""A download's bytes as they come (toolchain/download.py): the CUDA redist archives and the
sdists are read in chunks behind the progress line, against throwaway servers on loopback."""

from __future__ import annotations

import urllib.request

import pytest
from http_fixtures import serving, trickling

from factory import logger
from factory.toolchain import download

BODY = bytes(range(256)) * (12 << 10)  # 3 MiB


@pytest.mark.parametrize("length", [True, False])
def test_a_slow_download_shows_its_bytes_as_they_come(
        length: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(download, "QUIET_SECONDS", 0.2)
    monkeypatch.setattr(download, "CHUNK", 64 << 10)
    logger.configure()  # CI lines (no terminal): the first line, then the last one
    with serving(trickling(BODY, pieces=15, pause=0.1, length=length)) as url, \
            urllib.request.urlopen(url + "cuda_nvcc-12.8.93-archive.tar.xz") as resp:
        assert download.read_with_progress(resp, "cuda_nvcc-12.8.93-archive.tar.xz") == BODY
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    assert len(lines) >= 2 and all(
        line.startswith("cuda_nvcc-12.8.93-archive.tar.xz: ") for line in lines)
    first, last = lines[0], lines[-1]
    if length:
        assert "of 3.0 MiB" in first and not first.split(" of ")[0].endswith(" 3.0 MiB")
        assert ": 3.0 MiB of 3.0 MiB (100 %), " in last
    else:
        assert " of " not in last and ": 3.0 MiB, " in last
    assert last.endswith("s") and "/s, " in last


def test_a_quick_download_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    logger.configure()
    with serving(trickling(b"{}", pieces=1, pause=0)) as url, \
            urllib.request.urlopen(url + "redistrib_12.8.1.json") as resp:
        assert download.read_with_progress(resp, "redistrib_12.8.1.json") == b"{}"
    assert capsys.readouterr().err == ""
