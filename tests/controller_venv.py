"""The controller as its image ships it (deploy/Containerfile), built once per test session.

The image's controller has no torch: the Containerfile installs the package's requirements
without it, computed by its own one-line program over pyproject.toml, and then the package with
``pip install --no-deps``. :func:`controller_python` builds a virtualenv the same way, running the
Containerfile's own program and its own final check (so a change to how the image is built is a
change here), from a copy of this working tree (a non-editable install: the tests see the
current code, as the image would hold it). Every Kubernetes end-to-end test runs its controller
with this interpreter (tests/kube_harness.py); the pods keep the test environment's, with torch.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = REPO / "deploy" / "Containerfile"

_built: dict[str, Path] = {}


def _containerfile_program(pattern: str, what: str) -> str:
    found = re.search(pattern, CONTAINERFILE.read_text())
    assert found, f"{CONTAINERFILE} no longer has {what} (tests/controller_venv.py builds the controller as it does)"
    return found.group(1)


def image_requirements() -> list[str]:
    """The controller image's requirements: the Containerfile's own program (the one that writes
    its requirements.txt), run over this checkout's pyproject.toml."""
    program = _containerfile_program(r'python -c "([^"]+)" > /tmp/requirements\.txt', "its requirements program")
    program = program.replace("/src/pyproject.toml", str(REPO / "pyproject.toml"))
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def controller_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) as the image's controller gets it: without what would put
    this checkout or the test venv on its search path."""
    return {k: v for k, v in (os.environ if env is None else env).items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONUSERBASE")}


def _run(argv: list, what: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    # never in this checkout: `python -c` would import its package from the working directory
    proc = subprocess.run([str(a) for a in argv], env=controller_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def build(root: Path) -> Path:
    """A venv under ``root`` built as the Containerfile builds the image's; its python."""
    text = CONTAINERFILE.read_text()
    for step in ("pip install -r /tmp/requirements.txt", "pip install --no-deps /src"):
        assert step in text, f"the Containerfile no longer runs {step!r}: build the test controller as it now does"
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", venv], "python -m venv", root, timeout=120)
    python = venv / "bin" / "python"
    requirements = root / "requirements.txt"
    requirements.write_text("\n".join(image_requirements()) + "\n")
    _run([python, "-m", "pip", "install", "-q", "-r", requirements], "pip install -r requirements.txt", root)
    src = root / "src"  # what the Containerfile copies into /src
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "supervisor", src / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    _run([python, "-m", "pip", "install", "-q", "--no-deps", src], "pip install --no-deps", root)
    # the image's own check: the CLI and the controller import without torch
    _run([python, "-c", _containerfile_program(r'--no-deps /src \\\s*&& python -c "([^"]+)"', "its import check")],
         "the Containerfile's import check", root)
    where = _run([python, "-c", "import supervisor; print(supervisor.__file__)"], "import supervisor", root).stdout
    assert Path(where.strip()).is_relative_to(venv), f"the controller venv imports {where} (not its own copy)"
    no_torch = subprocess.run([python, "-c", "import torch"], env=controller_env(), capture_output=True, text=True,
                              timeout=60, cwd=root)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr, no_torch
    return python


def controller_python(tmp_path_factory=None) -> Path:
    """The image-like controller's python, built on first use in this test session: under
    pytest's ``tmp_path_factory`` when given (the harness's fixtures give it), else under a
    temporary directory removed when the session ends."""
    if "python" not in _built:
        if tmp_path_factory is not None:
            root = tmp_path_factory.mktemp("controller-image")
        else:
            root = Path(tempfile.mkdtemp(prefix="controller-image-"))
            atexit.register(shutil.rmtree, root, True)
        _built["python"] = build(root)
    return _built["python"]
