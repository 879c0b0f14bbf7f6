"""Compatibility environments: the main ``.venv`` with a few packages pinned to other releases.

Each environment under ``.venv-compat/<name>/`` is a bare venv (same interpreter as ``.venv``)
whose ``site-packages`` holds only the pinned wheels of its row in :data:`ENVS`, installed with
``--no-deps``; a ``.pth`` file then appends the main venv's ``site-packages`` AFTER its own, so
torch, numpy, energon, ... come from ``.venv`` and the pinned releases shadow theirs. Nothing
is resolved, so no install can pull a (multi-GB CUDA) torch. After installing, every pinned
distribution's own requirements are checked against what the environment sees, and the
environment's imports are tried, so a missing or wrong pin fails here, not in a test.

    python scripts/compat_envs.py setup [NAME ...]   # create / refresh (idempotent, skips up-to-date envs)
    python scripts/compat_envs.py list               # name, pins, tests (JSON)
    python scripts/compat_envs.py run NAME [PYTEST ARGS]  # run the row's tests in its env

``tests/project/test_compat_matrix.py`` runs each row's tests in its environment (the README's test
command therefore covers them). Run this with ``.venv/bin/python``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPAT_DIR = ROOT / ".venv-compat"

HF_TESTS = ("tests/integrations/test_integration_hf.py", "tests/chat/test_chat_templates.py")
# Hub 1.x (transformers 5.8-5.17 require huggingface-hub>=1.5,<2) talks HTTP through httpx.
_HUB1 = ("huggingface-hub==1.33.0", "httpx==0.28.1", "httpcore==1.0.9", "certifi==2026.4.22")
# Hub 0.x (transformers 4.57 requires huggingface-hub<1.0) talks HTTP through requests.
_HUB0 = ("huggingface-hub==0.36.2", "requests==2.32.5", "charset-normalizer==3.4.4", "certifi==2026.4.22")


@dataclass(frozen=True)
class Env:
    pins: tuple[str, ...]  # exact "name==version" requirements installed with --no-deps
    tests: tuple[str, ...]  # pytest paths / node ids run in the environment
    why: str
    timeout_s: int = 300
    imports: tuple[str, ...] = ()  # modules the setup check imports (default: each pin's top module)
    requirements_unchecked: tuple[str, ...] = ()  # pins whose own declared requirements are not checked


ENVS: dict[str, Env] = {
    "transformers-4.57.6": Env(
        ("transformers==4.57.6", "tokenizers==0.22.2") + _HUB0,
        HF_TESTS,
        "oldest supported transformers (4.57: first with Qwen3-VL; the 4.x line LLaMA-Factory users run)",
    ),
    "transformers-5.12.1": Env(
        ("transformers==5.12.1", "tokenizers==0.22.2") + _HUB1,
        HF_TESTS,
        "Megatron-Bridge's newest allowed (transformers>=5.8,<=5.12.1)",
    ),
    "transformers-5.17.0": Env(("transformers==5.17.0",) + _HUB1, HF_TESTS, "the GPU image's release"),
    "megatron-energon-7.4.0": Env(
        ("megatron-energon==7.4.0",),
        (
            "tests/energon/test_energon_bridge_layout.py",
            "tests/energon/test_energon_compat.py",  # the guards install on this tested release too
            "tests/energon/test_energon_packing.py::test_save_restore_gives_identical_next_packs[0]",
            "tests/energon/test_energon_packing.py::test_finite_epoch_covers_every_valid_sample_once_and_counts_skips",
            "tests/energon/test_energon_packing.py::test_single_pack_can_be_restored_from_its_restore_key",
            "tests/energon/test_energon_packing.py::test_image_limits_are_counted_skips_through_the_loader",
        ),
        "lowest megatron-energon allowed (>=7.4,<8; the main venv has the newest 7.x, 7.4.1)",
    ),
    "pillow-10.0.1": Env(
        ("pillow==10.0.1",),
        ("tests/pixels/test_pil_resample.py", "tests/pixels/test_pixel_path.py", "tests/pixels/test_pil_pixels.py"),
        "lowest Pillow allowed (megatron-energon needs >= 10.0.1): the PIL-exact resize and the pixel path",
    ),
    "numpy-1.24.4-numba-0.60.0": Env(
        ("numpy==1.24.4", "numba==0.60.0", "llvmlite==0.43.0"),
        (
            "tests/test_thd.py",
            "tests/qwen_vl/test_qwen_vl_vision.py",
            "tests/qwen_vl/test_qwen_vl_mrope.py",
            "tests/pixels/test_pil_resample.py",
        ),
        "lowest numpy and numba allowed: THD packing, pixels (numba's PIL-exact kernels) and M-RoPE",
    ),
    "megatron-bridge-0.3.1": Env(
        ("megatron-bridge==0.3.1", "megatron-core==0.16.1", "omegaconf==2.4.0", "einops==0.8.2"),
        ("tests/integrations/test_bridge_sft_validate.py", "tests/integrations/test_bridge_mtp.py"),
        "Bridge's own ConfigContainer.validate() on our GPT-SFT provider, and its loader, GPT-step batch, packed-seq "
        "params and loss on our packs, and Megatron-Core's MTP roll on our VLM packs: Bridge 0.3.1 (the newest on "
        "Python < 3.12, the last whose config needs only Megatron-Core) with real Megatron-Core 0.16.1 from PyPI",
        imports=("megatron.core", "omegaconf", "einops"),
        # Bridge declares its GPU stack (Transformer Engine, flash-attn, ...); the tests stand in for what it imports
        requirements_unchecked=("megatron-bridge",),
    ),
}


def python_of(name: str) -> Path:
    return COMPAT_DIR / name / "bin" / "python"


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _stamp(name: str) -> dict:
    main_site = sysconfig.get_paths()["purelib"]
    stamp = {"pins": ENVS[name].pins, "main_site_packages": main_site, "python": sys.version}
    return json.loads(json.dumps(stamp))  # as read back from the file (tuples become lists)


_VERIFY = r"""
import importlib, json, sys
from importlib.metadata import distribution, PackageNotFoundError
from packaging.requirements import Requirement
pins, modules, unchecked = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
problems = []
for pin in pins:
    req = Requirement(pin)
    dist = distribution(req.name)  # the first on sys.path: the environment's own copy
    if dist.version not in req.specifier:
        problems.append(f"{req.name} {dist.version} is seen, pinned {pin}")
    for raw in [] if req.name in unchecked else dist.requires or []:
        dep = Requirement(raw)
        if dep.marker is not None and not dep.marker.evaluate({"extra": ""}):
            continue
        try:
            have = distribution(dep.name).version
        except PackageNotFoundError:
            problems.append(f"{req.name} needs {dep} (missing)")
            continue
        if not dep.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} needs {dep}, the environment has {have}")
for module in modules:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        problems.append(f"import {module}: {type(e).__name__}: {e}")
print(json.dumps(problems))
"""


def _import_names(pins: tuple[str, ...]) -> list[str]:
    special = {
        "pillow": "PIL",
        "megatron-energon": "megatron.energon",
        "huggingface-hub": "huggingface_hub",
        "charset-normalizer": "charset_normalizer",
        "hf-xet": "hf_xet",
    }
    names = [p.split("==")[0].lower() for p in pins]
    return [special.get(n, n.replace("-", "_")) for n in names]


def verify(name: str) -> list[str]:
    """Problems with environment ``name`` (empty when its pins are seen and their requirements met)."""
    env = ENVS[name]
    modules = list(env.imports) or _import_names(env.pins)
    out = subprocess.run(
        [
            str(python_of(name)),
            "-c",
            _VERIFY,
            json.dumps(list(env.pins)),
            json.dumps(modules),
            json.dumps(list(env.requirements_unchecked)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if out.returncode != 0:
        return [f"verification crashed: {out.stderr.strip()[-2000:]}"]
    return json.loads(out.stdout.strip().splitlines()[-1])


def setup(name: str, *, quiet: bool = False) -> bool:
    """Create or refresh environment ``name``; False when it was already up to date."""
    env_dir = COMPAT_DIR / name
    stamp_file = env_dir / "compat-stamp.json"
    stamp = _stamp(name)
    if python_of(name).exists() and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return False
    COMPAT_DIR.mkdir(exist_ok=True)
    (COMPAT_DIR / ".gitignore").write_text("*\n")  # the whole folder stays out of git
    if env_dir.exists():
        shutil.rmtree(env_dir)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = _site_packages(python_of(name))
    # Appended after the env's own site-packages; addsitedir also runs the main venv's .pth files
    # (the editable energon_pack install among them).
    (site / "zz_main_venv.pth").write_text(f"import site; site.addsitedir({stamp['main_site_packages']!r})\n")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python_of(name)),
        "install",
        "--no-deps",
        "--disable-pip-version-check",
        *(["--quiet"] if quiet else []),
        *ENVS[name].pins,
    ]
    subprocess.run(cmd, check=True)
    problems = verify(name)
    if problems:
        raise SystemExit(f"compat env {name}: " + "; ".join(problems))
    stamp_file.write_text(json.dumps(stamp, indent=1))
    return True


def pinned_versions_seen(name: str) -> dict[str, tuple[str, str | None]]:
    """{distribution: (pinned, seen by the environment's python)} for the pins it does not see (empty: all seen)."""
    pins = dict(p.split("==") for p in ENVS[name].pins)
    code = (
        "import json, sys\nfrom importlib.metadata import version\nout = {}\nfor n in json.loads(sys.argv[1]):\n"
        "    try: out[n] = version(n)\n    except Exception: out[n] = None\nprint(json.dumps(out))"
    )
    out = subprocess.run(
        [str(python_of(name)), "-c", code, json.dumps(list(pins))], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    return {n: (v, seen[n]) for n, v in pins.items() if seen[n] != v}


def run(name: str, *pytest_args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """The row's tests in environment ``name``: ``python -m pytest -q TESTS PYTEST_ARGS``."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", ENERGON_PACK_COMPAT_ENV=name)
    cmd = [str(python_of(name)), "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENVS[name].tests, *pytest_args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout or ENVS[name].timeout_s
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("setup", "list", "run"):
        print(__doc__)
        return 2
    if argv[0] == "list":
        print(json.dumps({n: asdict(e) for n, e in ENVS.items()}, indent=1))
        return 0
    if argv[0] == "run":
        result = run(argv[1], *argv[2:], timeout=3600)
        sys.stdout.write(result.stdout + result.stderr)
        return result.returncode
    names = argv[1:] or list(ENVS)
    unknown = sorted(set(names) - set(ENVS))
    if unknown:
        print(f"unknown compat env(s) {unknown}; known: {list(ENVS)}", file=sys.stderr)
        return 2
    if not argv[1:] and COMPAT_DIR.exists():  # environments no longer in the table
        for stale in sorted(p for p in COMPAT_DIR.iterdir() if p.is_dir() and p.name not in ENVS):
            shutil.rmtree(stale)
            print(f"compat env {stale.name}: removed (no longer in scripts/compat_envs.py)")
    for name in names:
        made = setup(name, quiet=True)
        print(f"compat env {name}: {'created' if made else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
