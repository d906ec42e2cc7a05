"""Where the diag endpoints live (smcr.diag.paths): private directories only.

Each level of the user's diag directory is created 0700 and refused when it is a
symlink, a file, another user's or open to group or others (smc-tools' stats cache in a
shared directory was a local denial of service); root reads every user's directory, but
only one owned by the uid its name says.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from smcr.diag import paths

OTHER_UID = 54321  # nobody's: no /run/user/54321 on a test host


@pytest.fixture(autouse=True)
def no_diag_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets ``SMCR_DIAG_DIR`` itself if it wants one."""
    monkeypatch.delenv("SMCR_DIAG_DIR", raising=False)


def private_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=0o700)
    os.chmod(path, mode)
    return path


def refused(path: Path, uid: int | None = None) -> bool:
    try:
        paths.check_private(path, uid)
    except paths.UnsafeDirectoryError as exc:
        assert exc.errno == errno.EPERM and str(path) in str(exc)
        return True
    return False


def test_the_user_base_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert paths.user_base(0) == Path("/run/smcr")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert not Path(f"/run/user/{OTHER_UID}").exists()
    assert paths.user_base(OTHER_UID) == tmp_path / f"smcr-{OTHER_UID}"
    if os.getuid() != 0:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
        assert paths.user_base() == tmp_path / "xdg" / "smcr"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))  # not another user's
    assert paths.user_base(OTHER_UID) == tmp_path / f"smcr-{OTHER_UID}"


def test_own_directory_and_the_switch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert paths.own_directory() == paths.user_base() / "diag"
    monkeypatch.setenv("SMCR_DIAG_DIR", str(tmp_path))
    assert paths.own_directory() == tmp_path
    for value, on in (("1", True), ("0", False), ("off", False), ("no", False)):
        monkeypatch.setenv("SMCR_DIAG", value)
        assert paths.enabled() is on
    monkeypatch.delenv("SMCR_DIAG")
    assert paths.enabled()


def test_only_a_real_directory_of_ours_closed_to_others_is_private(tmp_path: Path) -> None:
    good = private_dir(tmp_path / "good")
    assert not refused(good)
    assert refused(good, uid=OTHER_UID)  # ours, but asked for another user's
    for mode in (0o750, 0o705, 0o777, 0o701):
        assert refused(private_dir(tmp_path / f"open{mode:o}", mode)), oct(mode)
    link = tmp_path / "link"
    link.symlink_to(good)
    assert refused(link)  # lstat: a symlink to a private directory is not one
    file = tmp_path / "file"
    file.write_text("")
    os.chmod(file, 0o600)
    assert refused(file)


def test_ensure_private_creates_both_levels_0700_and_refuses_what_is_not_ours(
        tmp_path: Path) -> None:  # fmt: skip
    made = paths.ensure_private(tmp_path / "base" / "diag")
    for level in (made.parent, made):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    assert paths.ensure_private(made) == made  # again: there, fine
    open_base = private_dir(tmp_path / "open", 0o755)
    with pytest.raises(paths.UnsafeDirectoryError):
        paths.ensure_private(open_base / "diag")
    elsewhere = private_dir(tmp_path / "elsewhere")
    (tmp_path / "trap").symlink_to(elsewhere)
    with pytest.raises(paths.UnsafeDirectoryError):
        paths.ensure_private(tmp_path / "trap" / "diag")  # a planted symlink on the way
    assert not (elsewhere / "diag").exists()  # nothing made through it


def test_an_smcr_diag_dir_is_taken_as_given_but_must_be_a_directory_of_ours(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    given = tmp_path / "given" / "diag"
    monkeypatch.setenv("SMCR_DIAG_DIR", str(given))
    assert paths.ensure_private(given) == given and given.is_dir()  # made, parents too
    file = tmp_path / "file"
    file.write_text("")
    monkeypatch.setenv("SMCR_DIAG_DIR", str(file))
    with pytest.raises(paths.UnsafeDirectoryError):
        paths.ensure_private(file)
    assert paths.visible_directories() == [(file, os.getuid())]  # only the given one


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (directories of other uids)")
def test_root_reads_every_users_directory_owned_as_its_name_says(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name, owner, mode in (("smcr-54321", 54321, 0o700),  # a user's: read
                              ("smcr-54322", 54321, 0o700),  # owned by another uid: lies
                              ("smcr-54323", 54323, 0o755),  # open to others
                              ("smcr-x", 54324, 0o700)):  # not a uid  # fmt: skip
        base = private_dir(tmp_path / name)
        diag = private_dir(base / "diag", mode)
        for level in (base, diag):
            os.chown(level, owner, owner)
    found = paths.visible_directories()
    assert found[0] == (Path("/run/smcr/diag"), 0)  # root's own first
    ours = [(p, uid) for p, uid in found if p.is_relative_to(tmp_path)]
    assert ours == [(tmp_path / "smcr-54321" / "diag", 54321)]
