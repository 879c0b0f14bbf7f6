"""The first hour of a new user: the clone's folder found as ``energon_pack`` (Python started in the folder that
holds the clone) says what is wrong in one line, and tools started inside the clone still get the real package."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _import_from(holder: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` run with ``holder`` (the folder that holds the clone) first on ``sys.path``, as Python puts a
    script's folder there."""
    prelude = f"import sys; sys.path.insert(0, {str(holder)!r}); "
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_import_from_the_folder_that_holds_the_clone_says_the_fix_in_one_line(tmp_path):
    (tmp_path / "energon_pack").symlink_to(ROOT)
    proc = _import_from(tmp_path, tmp_path, "from energon_pack import load_tokenizer")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"ImportError: energon_pack: {tmp_path}/energon_pack is the clone's folder, not the package: Python looks "
        f"in {tmp_path} first (your script's or current folder); move the script or cd out of it, or rename the "
        "clone folder"
    )


def test_inside_the_clone_its_folder_imports_as_the_real_package(tmp_path):
    """pytest imports the rootdir's ``__init__.py`` under the rootdir's name with its parent first on the path."""
    (tmp_path / "energon_pack").symlink_to(ROOT)
    code = "import energon_pack; print(energon_pack.__file__, energon_pack.load_tokenizer.__module__)"
    proc = _import_from(tmp_path, tmp_path / "energon_pack" / "tests", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        str(tmp_path / "energon_pack" / "energon_pack" / "__init__.py"),
        "energon_pack.chat.tokenizer",
    ]


def test_the_root_init_is_not_packaged():
    assert '[tool.setuptools.packages.find]\ninclude = ["energon_pack*"]' in (ROOT / "pyproject.toml").read_text()
