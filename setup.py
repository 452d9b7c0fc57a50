"""Builds hvdtorch: CMake compiles the torch-free core, the extension module
hvdtorch/_C and, where torch is a CUDA build and nvcc is found, the core's CUDA
device; this file only tells CMake where torch is and what it demands.

Build against the torch already installed (never let pip fetch another one):
    pip install --no-build-isolation .          # users: the package and the extension
    pip install --no-build-isolation -e .       # developers (`make build`)

Environment (all optional):
    HVDTORCH_BUILD_DIR    CMake build folder (default build/cmake); kept, so rebuilds are incremental
    HVDTORCH_BUILD_TYPE   Release (default), RelWithDebInfo, Debug
    HVDTORCH_BUILD_TESTS  1: also the C++ unit tests and core benchmarks (make build sets it)
    HVDTORCH_CUDA         0: leave the CUDA device out even where torch is a CUDA build
    CMAKE_CUDA_ARCHITECTURES  GPU architectures of the CUDA device (default 90: Hopper)
    MAX_JOBS              parallel compile jobs (default 2)
    HVDTORCH_BUILD_TARGETS  CMake targets to build, space-separated (default: all); make gpu-check
                          builds only the extension and the CUDA suites
"""

import os
import re
import shutil
import subprocess
import sys
import time
import warnings

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# The torch releases hvdtorch is built and tested against (README "Install" says the same).
# Older ones are refused; newer ones build with a warning, as their C++ API may have moved.
TORCH_OLDEST = (2, 11)
TORCH_NEWEST_TESTED = (2, 14)


def _unity_batch() -> str:
    value = os.environ.get("HVDTORCH_BUILD_UNITY_BATCH", "8")
    if not value.isdigit():
        raise SystemExit(f"hvdtorch: HVDTORCH_BUILD_UNITY_BATCH={value!r}: a number of files (0: no unity build)")
    return value


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() not in ("0", "false", "off", "no", "")


def torch_release(version: str):
    """(major, minor) of a torch version string such as '2.14.1+cu130'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise RuntimeError(f"hvdtorch: cannot read the installed torch's version {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch_release(version: str) -> None:
    release = torch_release(version)
    if release < TORCH_OLDEST:
        raise RuntimeError(
            f"hvdtorch needs torch {TORCH_OLDEST[0]}.{TORCH_OLDEST[1]} or newer; the installed torch is {version}. "
            "Install a supported torch first, then build hvdtorch with --no-build-isolation."
        )
    if release > TORCH_NEWEST_TESTED:
        warnings.warn(
            f"hvdtorch is tested with torch up to {TORCH_NEWEST_TESTED[0]}.{TORCH_NEWEST_TESTED[1]}; "
            f"building against {version}",
            stacklevel=1,
        )


def torch_cxx_standard(include_dirs) -> int:
    """The C++ standard the installed torch's headers demand: ATen/ATen.h stops
    with #error below it (`__cplusplus < 202002L` from torch 2.14 on). 17 where
    the guard is not found."""
    for d in include_dirs:
        header = os.path.join(d, "ATen", "ATen.h")
        if os.path.exists(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                match = re.search(r"__cplusplus\s*<\s*(\d{4})(\d{2})L", f.read())
            if match:
                year = int(match.group(1))
                return {2017: 17, 2020: 20, 2023: 23}.get(year, 17 if year < 2020 else 20)
    return 17


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _import_torch():
    """The installed torch, or one clear line saying how to build against it."""
    try:
        import torch
    except ImportError:
        raise SystemExit(
            "hvdtorch: the build cannot see torch. hvdtorch compiles against the torch you train with, and pip's "
            "build isolation hides it: install torch first (e.g. pip install torch==2.13.0), then build with "
            "`pip install --no-build-isolation .`"
        ) from None
    return torch


class _Progress:
    """Ninja's [done/total] lines, every 10% (and the time so far), on the
    terminal: pip keeps a build's output to itself unless it fails (or -v),
    and a cold build takes minutes. Nothing where there is no terminal."""

    def __init__(self):
        try:
            self._tty = open("/dev/tty", "w")
        except OSError:
            self._tty = None
        self._start = time.monotonic()
        self._shown = -1

    def line(self, text: str) -> None:
        match = re.match(r"\[(\d+)/(\d+)\]", text)
        if self._tty is None or not match:
            return
        done, total = int(match.group(1)), int(match.group(2))
        tenth = done * 10 // max(total, 1)
        if tenth == self._shown:
            return
        self._shown = tenth
        minutes = (time.monotonic() - self._start) / 60
        self._tty.write(
            f"hvdtorch: compiling {done}/{total} ({minutes:.1f} min so far; a cold build takes 2-5 minutes on 2 "
            "cores, more with the CUDA device; later builds recompile only what changed)\n"
        )
        self._tty.flush()


def _build(cmd, env) -> None:
    """``cmd``, its output passed on, its progress shown (_Progress); raises as check_call does."""
    progress = _Progress()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for text in proc.stdout:
            sys.stdout.write(text)
            progress.line(text)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        torch = _import_torch()
        from torch.utils import cpp_extension

        check_torch_release(torch.__version__)
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        filename = os.path.basename(target)
        # An editable install (make build) and build_ext --inplace import the extension from the
        # source tree: CMake writes it there, so that a plain `cmake --build` of the build folder
        # updates what `import hvdtorch` loads. A wheel's build (pip install .) writes into pip's
        # temporary folder, gone after the install: there a later `cmake --build` would update
        # nothing anyone imports, so CMake refuses it (HVDTORCH_EXT_FOR_WHEEL).
        in_tree = bool(self.inplace or getattr(self, "editable_mode", False))
        out_dir = os.path.join(ROOT, *ext.name.split(".")[:-1]) if in_tree else os.path.dirname(target)
        build_dir = os.environ.get("HVDTORCH_BUILD_DIR", os.path.join(ROOT, "build", "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        include_dirs = cpp_extension.include_paths()
        with_cuda = torch.version.cuda is not None
        args = [
            "cmake",
            "-S",
            ROOT,
            "-B",
            build_dir,
            "-DCMAKE_BUILD_TYPE=" + os.environ.get("HVDTORCH_BUILD_TYPE", "Release"),
            "-DHVDTORCH_CXX_STANDARD=" + str(torch_cxx_standard(include_dirs)),
            "-DTORCH_INCLUDE_DIRS=" + ";".join(include_dirs),
            "-DTORCH_LIBRARY_DIRS=" + ";".join(cpp_extension.library_paths()),
            "-DHVDTORCH_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
            "-DHVDTORCH_EXT_OUTPUT_DIR=" + out_dir,
            "-DHVDTORCH_EXT_FILENAME=" + filename,
            "-DHVDTORCH_EXT_FOR_WHEEL=" + ("OFF" if in_tree else "ON"),
            "-DHVDTORCH_WITH_CUDA=" + ("ON" if with_cuda else "OFF"),
            # The CUDA device is compiled where torch can hand it CUDA tensors.
            "-DHVDTORCH_CUDA=" + ("ON" if with_cuda and _env_flag("HVDTORCH_CUDA", True) else "OFF"),
            "-DHVDTORCH_BUILD_TESTS=" + ("ON" if _env_flag("HVDTORCH_BUILD_TESTS", False) else "OFF"),
            # csrc/torch compiled 8 files per translation unit (its cold build in a third of the time);
            # 0 while editing csrc/torch (file by file: an edit rebuilds one file, not its batch).
            "-DHVDTORCH_UNITY_BATCH=" + _unity_batch(),
            # make test-asan-py: the extension itself under ASan+UBSan (empty: none).
            "-DHVDTORCH_SANITIZE=" + os.environ.get("HVDTORCH_SANITIZE", ""),
            "-DPython3_EXECUTABLE=" + sys.executable,
        ]
        if os.environ.get("CMAKE_CUDA_ARCHITECTURES"):
            args.append("-DCMAKE_CUDA_ARCHITECTURES=" + os.environ["CMAKE_CUDA_ARCHITECTURES"])
        if subprocess.call(["which", "ninja"], stdout=subprocess.DEVNULL) == 0:
            args += ["-G", "Ninja"] if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) else []
        subprocess.check_call(args)
        jobs = os.environ.get("MAX_JOBS", "2")
        targets = os.environ.get("HVDTORCH_BUILD_TARGETS", "").split()
        target_args = ["--target", *targets] if targets else []
        env = dict(os.environ, HVDTORCH_SETUP_BUILD="1")  # this build is setup.py's own (see CMakeLists.txt)
        _build(["cmake", "--build", build_dir, *target_args, "--", "-j" + jobs], env)
        built = os.path.join(out_dir, filename)
        if not targets or "hvdtorch_ext" in targets:
            if os.path.abspath(built) != target:  # an editable install: setuptools copies it from target
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(built, target)


# Name, version, dependencies and the rest of the metadata: [project] in
# pyproject.toml. This call only adds the packages and the CMake-built extension.
setup(
    packages=find_packages(include=["hvdtorch", "hvdtorch.*"]),
    ext_modules=[CMakeExtension("hvdtorch._C")],
    cmdclass={"build_ext": CMakeBuild},
)
