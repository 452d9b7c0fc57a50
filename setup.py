"""Builds hvdtorch: CMake compiles the torch-free core, the C++ tests and the
extension module hvdtorch/_C; this file only tells CMake where torch is.

Build against the torch already installed (never let pip fetch another one):
    pip install --no-build-isolation -e .
"""

import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch
        from torch.utils import cpp_extension

        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        out_dir, filename = os.path.split(target)
        build_dir = os.environ.get("HVDTORCH_BUILD_DIR", os.path.join(ROOT, "build", "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        with_cuda = torch.cuda.is_available() or torch.version.cuda is not None
        args = [
            "cmake",
            "-S",
            ROOT,
            "-B",
            build_dir,
            "-DCMAKE_BUILD_TYPE=" + os.environ.get("HVDTORCH_BUILD_TYPE", "Release"),
            "-DTORCH_INCLUDE_DIRS=" + ";".join(cpp_extension.include_paths()),
            "-DTORCH_LIBRARY_DIRS=" + ";".join(cpp_extension.library_paths()),
            "-DHVDTORCH_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
            "-DHVDTORCH_EXT_OUTPUT_DIR=" + out_dir,
            "-DHVDTORCH_EXT_FILENAME=" + filename,
            "-DHVDTORCH_WITH_CUDA=" + ("ON" if with_cuda else "OFF"),
            "-DPython3_EXECUTABLE=" + sys.executable,
        ]
        if subprocess.call(["which", "ninja"], stdout=subprocess.DEVNULL) == 0:
            args += ["-G", "Ninja"] if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) else []
        subprocess.check_call(args)
        jobs = os.environ.get("MAX_JOBS", "2")
        subprocess.check_call(["cmake", "--build", build_dir, "--", "-j" + jobs])


# Name, version, dependencies and the rest of the metadata: [project] in
# pyproject.toml. This call only adds the packages and the CMake-built extension.
setup(
    packages=find_packages(include=["hvdtorch", "hvdtorch.*"]),
    ext_modules=[CMakeExtension("hvdtorch._C")],
    cmdclass={"build_ext": CMakeBuild},
)
