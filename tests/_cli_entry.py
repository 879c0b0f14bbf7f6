"""The installed ``energon-pack`` console script (``python -m energon_pack.cli`` where it is not
installed), for tests that run the CLI in a subprocess as a user does."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def energon_pack_command() -> list[str]:
    script = Path(sys.executable).parent / "energon-pack"
    return [str(script)] if script.exists() else [sys.executable, "-m", "energon_pack.cli"]


def energon_pack(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run ``energon-pack ARGS`` to the end (stdout and stderr captured as text)."""
    return subprocess.run(
        energon_pack_command() + list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw
    )


def one_error_line(err: str, command: str) -> str:
    """The one ``energon-pack COMMAND: error: ...`` line of ``err`` (asserting there is exactly one, no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"energon-pack {command}: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]
