"""ferry's PEP 517 build backend: scikit-build-core, plus the CUDA toolkit from pip
when the machine has no suitable one.

Before it builds, pip asks the backend what the build needs
(get_requires_for_build_wheel) and installs that into the isolated build
environment. scikit-build-core answers with CMake and ninja when the machine lacks
them; this answers, in addition, with the CUDA toolkit's compiler, headers and
static runtime (``cuda-toolkit[nvcc,cccl]==13.0.*``: nvidia-cuda-nvcc, -crt,
-runtime, -cccl and nvidia-nvvm, about 100 MB to download) when no system toolkit of
ferry's CUDA line is found, so a machine with only a C++ compiler and Python can
``pip install .``. A machine that has the toolkit downloads nothing more.

CMake then picks the toolkit (cmake/cuda_toolkit.cmake) and says which in the log.
The choice is the CMake define FERRY_CUDA_TOOLKIT (auto, system or pip), read here
from ``-Ccmake.define.FERRY_CUDA_TOOLKIT=...`` or the SKBUILD_CMAKE_DEFINE and
CMAKE_ARGS environment variables, so pip and CMake always agree:
``pip install . -Ccmake.define.FERRY_CUDA_TOOLKIT=pip`` builds with the pip toolkit
even where a system one exists.

Every other hook is scikit-build-core's, unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  (the hooks not changed here)

_SOURCE = Path(__file__).resolve().parent.parent


def cuda_line() -> tuple[int, int]:
    """ferry's CUDA line, (13, 0), from FERRY_CUDA_LINE in CMakeLists.txt."""
    text = (_SOURCE / "CMakeLists.txt").read_text()
    m = re.search(r'set\(FERRY_CUDA_LINE "(\d+)\.(\d+)"\)', text)
    if not m:
        raise RuntimeError("CMakeLists.txt does not set FERRY_CUDA_LINE")
    return int(m.group(1)), int(m.group(2))


def pip_toolkit_requirement() -> str:
    major, minor = cuda_line()
    return f"cuda-toolkit[nvcc,cccl]=={major}.{minor}.*"


def _cmake_define(name: str, config_settings: dict | None) -> str | None:
    """The value of a CMake define as scikit-build-core will pass it, or None."""
    value = (config_settings or {}).get(f"cmake.define.{name}")
    if isinstance(value, list):  # the same -C given twice
        value = value[-1]
    if value is not None:
        return str(value)
    for item in os.environ.get("SKBUILD_CMAKE_DEFINE", "").split(";"):
        key, _, v = item.partition("=")
        if key.strip().split(":")[0] == name:
            return v.strip()
    m = re.search(rf"-D\s*{name}(?::\w+)?=(\S+)", os.environ.get("CMAKE_ARGS", ""))
    return m.group(1) if m else None


def nvcc_version(nvcc: str) -> tuple[int, int] | None:
    """(major, minor) of an nvcc that runs, else None."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_system_nvcc() -> tuple[str, tuple[int, int]] | None:
    """The first nvcc that runs, where cmake/cuda_toolkit.cmake looks, in its order:
    PATH, $CUDA_PATH/bin, $CUDA_HOME/bin, /usr/local/cuda/bin."""
    candidates = [shutil.which("nvcc")]
    candidates += [os.path.join(os.environ[v], "bin", "nvcc")
                   for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    candidates.append("/usr/local/cuda/bin/nvcc")
    for nvcc in candidates:
        if nvcc and os.path.isfile(nvcc):
            version = nvcc_version(nvcc)
            if version:
                return nvcc, version
    return None


def cuda_requires(config_settings: dict | None = None) -> list[str]:
    """The CUDA toolkit pieces pip must install for this build: none, or the pip toolkit."""
    if _cmake_define("CMAKE_CUDA_COMPILER", config_settings) or os.environ.get("CUDACXX"):
        return []  # the user chose the compiler
    mode = (_cmake_define("FERRY_CUDA_TOOLKIT", config_settings) or "auto").lower()
    if mode == "system":
        return []
    if mode == "auto":
        found = find_system_nvcc()
        major, minor = cuda_line()
        if found and found[1][0] == major and found[1] >= (major, minor):
            return []
    return [pip_toolkit_requirement()]  # "pip", or "auto" without a suitable toolkit;
    # CMake rejects any other mode with a clear message


def get_requires_for_build_wheel(config_settings=None):
    return _skbuild.get_requires_for_build_wheel(config_settings) + cuda_requires(config_settings)


def get_requires_for_build_editable(config_settings=None):
    return (_skbuild.get_requires_for_build_editable(config_settings)
            + cuda_requires(config_settings))
