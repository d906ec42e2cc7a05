"""UEIDs as host configuration (:mod:`smcr.ueid`) and ``smcr ueid``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smcr import ueid
from smcr.cli import main
from smcr.wire.clc import make_eid


@pytest.mark.parametrize("text", ["SMC-KVM-TEST", "A", "9.X-Y", "A" * 32, "ABC  "])
def test_valid_ueids_encode_blank_padded(text: str) -> None:
    eid = ueid.encode(text)
    assert len(eid) == 32 and eid.startswith(text.rstrip().encode())
    assert eid == text.encode().ljust(32)


@pytest.mark.parametrize("text", ["", "   ", "-ABC", ".ABC", "smc", "A B", "A_B", "A" * 33,
                                  "ÄB", "A\tB"])
def test_invalid_ueids_are_refused_as_linux_refuses_them(text: str) -> None:
    with pytest.raises(ueid.UeidError) as info:
        ueid.encode(text)
    assert info.value.errno_name == "EINVAL"


def test_the_module_and_the_codec_agree() -> None:
    assert ueid.encode("SMC-KVM-TEST") == make_eid("SMC-KVM-TEST")


def test_add_del_flush_as_the_kernel_table(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "ueid"
    assert ueid.load(path) == ()
    ueid.add("E0", path)
    with pytest.raises(ueid.UeidError) as dup:
        ueid.add("E0", path)
    assert dup.value.errno_name == "EEXIST"
    for i in range(1, 8):
        ueid.add(f"E{i}", path)
    assert [ueid.decode(e) for e in ueid.load(path)] == [f"E{i}" for i in range(8)]
    with pytest.raises(ueid.UeidError) as full:  # Linux checks the count first
        ueid.add("E0", path)
    assert full.value.errno_name == "ERANGE"
    ueid.remove("E3", path)
    assert ueid.encode("E3") not in ueid.load(path)
    with pytest.raises(ueid.UeidError) as gone:
        ueid.remove("E3", path)
    assert gone.value.errno_name == "ENOENT"
    assert path.stat().st_mode & 0o777 == 0o644
    ueid.flush(path)
    assert ueid.load(path) == ()


def test_a_hand_edited_file_keeps_the_valid_lines(tmp_path: Path) -> None:
    path = tmp_path / "ueid"
    path.write_text("# site EIDs\nGOOD-1\nbad one\n\nGOOD-2   # comment\nGOOD-1\n")
    assert ueid.load(path) == (ueid.encode("GOOD-1"), ueid.encode("GOOD-2"))


def test_the_table_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ueid"
    table = ueid.UeidTable(path)
    assert table.current() == ()
    ueid.add("ONE", path)
    assert table.current() == (ueid.encode("ONE"),)
    ueid.add("TWO-2", path)  # a different size: seen even within the same mtime tick
    assert table.current() == (ueid.encode("ONE"), ueid.encode("TWO-2"))
    path.unlink()
    assert table.current() == ()


def test_cli_ueid_show_add_del_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ueid.ENV, str(tmp_path / "ueid"))
    assert main(["ueid"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["ueid", "add", "SMC-KVM-TEST"]) == 0
    assert main(["ueid", "add", "SITE.2"]) == 0
    assert main(["ueid", "show"]) == 0
    assert capsys.readouterr().out.splitlines() == ["SMC-KVM-TEST", "SITE.2"]
    assert main(["ueid", "add", "lower"]) == 1
    assert "EINVAL" in capsys.readouterr().err
    assert main(["ueid", "del", "SITE.2"]) == 0
    assert main(["ueid", "del", "SITE.2"]) == 1
    assert "ENOENT" in capsys.readouterr().err
    assert main(["ueid", "flush"]) == 0
    assert main(["ueid", "show"]) == 0
    assert capsys.readouterr().out == ""


def test_a_planted_symlink_beside_the_table_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The table in a shared directory (``SMCR_UEID_FILE``): a symlink planted where the
    temporary file would be named by the pid does not make the write land elsewhere."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "ueid"
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    (tmp_path / ".ueid.4242").symlink_to(victim)
    ueid.add("E0", path)
    assert victim.read_text() == "precious\n"
    assert ueid.load(path) == (ueid.encode("E0"),)
    assert (path.stat().st_mode & 0o777) == 0o644
