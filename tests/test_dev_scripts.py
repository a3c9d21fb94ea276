"""The developer scripts behind `make test`: the disk-space check that runs before each environment's install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK_SPACE = ROOT / "scripts" / "check_space.sh"


def _check(venv: Path, need_mb: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CHECK_SPACE), str(venv), str(need_mb)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )


def test_enough_room_passes_quietly(tmp_path: Path) -> None:
    result = _check(tmp_path / ".venv", 1)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_too_little_room_stops_with_one_clear_message(tmp_path: Path) -> None:
    result = _check(tmp_path / ".venv", 10**12)
    assert result.returncode == 1
    assert f"{tmp_path / '.venv'} needs about {10**12} MB free" in result.stderr
    assert "SKIP_SPACE_CHECK=1" in result.stderr


def test_a_small_temporary_directory_does_not_stop_the_install(tmp_path: Path) -> None:
    # pip writes the wheels into the venv, not TMPDIR: a small tmpfs /tmp must not fail an install that fits.
    tmpfs = Path("/dev/shm")
    if not tmpfs.is_dir():
        pytest.skip("no /dev/shm here")
    tmpfs_mb = shutil.disk_usage(tmpfs).free // 2**20
    venv_disk_mb = shutil.disk_usage(tmp_path).free // 2**20
    if venv_disk_mb - tmpfs_mb < 200:
        pytest.skip("/dev/shm is not clearly smaller than the venv's disk here")
    # Halfway between the two, so df's rounding cannot tip either side: more than /dev/shm has, less than the disk.
    assert _check(tmp_path / ".venv", (tmpfs_mb + venv_disk_mb) // 2, TMPDIR=str(tmpfs)).returncode == 0


def test_the_check_can_be_skipped(tmp_path: Path) -> None:
    assert _check(tmp_path / ".venv", 10**12, SKIP_SPACE_CHECK="1").returncode == 0


def test_an_installed_environment_is_not_checked_again(tmp_path: Path) -> None:
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    assert _check(tmp_path / ".venv", 10**12).returncode == 0
