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


def _fake_venv(folder: Path, torch_installed: bool) -> Path:
    """``folder`` with a copy of setup.sh and a .venv whose python and pip only log their arguments."""
    import shutil

    shutil.copy(ROOT / "setup.sh", folder / "setup.sh")
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    has_torch = "exit 0" if torch_installed else "exit 1"
    (bin_dir / "python").write_text(
        '#!/bin/sh\necho "python $*" >> "$(dirname "$0")/../../calls"\n'
        f'case "$*" in "-c import torch") {has_torch};; "-c import torch; print"*) echo "0.28.*";; esac\n'
    )
    pip = '#!/bin/sh\necho "pip $*" >> "$(dirname "$0")/../../calls"\n'
    pip += 'case "$*" in *--target*) mkdir -p .venv/video-reference;; esac\n'
    (bin_dir / "pip").write_text(pip)
    for exe in ("python", "pip"):
        (bin_dir / exe).chmod(0o755)
    return folder


def test_setup_says_each_step_in_one_line(tmp_path):
    """setup.sh runs for minutes: each step announces itself (pip is --quiet), in order, and each announced
    step runs."""
    folder = _fake_venv(tmp_path, torch_installed=False)
    proc = subprocess.run(["bash", "setup.sh"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "setup.sh: installing torch 2.13.0 (the CPU wheel, first: see the top of this file)...",
        "setup.sh: installing energon-pack[hf] (editable) and its requirements...",
        "setup.sh: done: .venv/bin/energon-pack demo",
    ]
    assert [c for c in (folder / "calls").read_text().splitlines() if c.startswith("pip")] == [
        "pip install --quiet torch==2.13.0",
        "pip install --quiet -e .[hf]",
    ]


def test_setup_test_says_each_test_environment(tmp_path):
    folder = _fake_venv(tmp_path, torch_installed=True)
    proc = subprocess.run(["bash", "setup.sh", "--test"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "setup.sh: installing energon-pack[hf,test,docs,examples] (editable) and its requirements...",
        "setup.sh: building test environments: Megatron-Bridge's wheel...",
        "setup.sh: building test environments: the video reference (.venv/video-reference)...",
        "setup.sh: building test environments: the compatibility environments (.venv-compat)...",
        "setup.sh: done: .venv/bin/python -m pytest -q -n 2 --dist loadfile",
    ]
    assert "python scripts/compat_envs.py setup" in (folder / "calls").read_text()
