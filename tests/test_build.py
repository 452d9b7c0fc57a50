"""What the installed build holds, checked against the torch it runs with:
the C++ standard its headers demand, the CUDA device compiled and linked where
torch is a CUDA build and nvcc exists, never the driver library (import must
work on a machine without a GPU driver), and cuda_built()/nccl_built() telling
the truth, and a rebuild of the build folder updating the extension Python
imports. `make test` checks the CPU build, `make test-cuda-build` the CUDA one."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import hvdtorch as hvd
from hvdtorch import _C


def needed_libraries(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)


def headers_demand():
    """The C++ standard below which torch's ATen/ATen.h stops with #error."""
    from torch.utils.cpp_extension import include_paths

    for d in include_paths():
        header = os.path.join(d, "ATen", "ATen.h")
        if os.path.exists(header):
            with open(header) as f:
                match = re.search(r"__cplusplus < (\d{4})\d{2}L", f.read())
            return {"2017": 17, "2020": 20}[match.group(1)]
    raise AssertionError("ATen/ATen.h not found in torch's include paths")


def test_compiled_with_the_standard_torchs_headers_demand():
    assert _C.build_info()["cxx_standard"] == headers_demand()


def test_cuda_device_built_exactly_where_torch_has_cuda_and_nvcc_exists():
    info = _C.build_info()
    assert info["torch_cuda"] == (torch.version.cuda is not None)
    if torch.version.cuda is None:
        assert not info["cuda_device"] and not hvd.cuda_built()
    elif shutil.which("nvcc") or os.environ.get("CUDACXX"):
        assert info["cuda_device"] and hvd.cuda_built()
        assert info["cuda_architectures"]  # e.g. "90"
    assert hvd.nccl_built() == (torch.version.cuda is not None and dist.is_nccl_available())


def test_extension_never_links_the_driver_library():
    needed = needed_libraries(_C.__file__)
    assert not [lib for lib in needed if lib.startswith("libcuda.")], needed
    if hvd.cuda_built():
        # The CUDA runtime, shared (torch loads the same one), is what the device code calls.
        assert [lib for lib in needed if lib.startswith("libcudart.so")], needed


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch has no CUDA runtime to ask")
def test_visible_gpus_agree_with_torch_and_none_comes_with_a_reason():
    info = _C.build_info()
    if not info["cuda_device"]:
        pytest.skip("this build has no CUDA device (no nvcc when it was built)")
    assert info["cuda_devices_visible"] == torch.cuda.device_count()
    if info["cuda_devices_visible"] == 0:
        assert info["cuda_devices_why_none"]  # CUDA's own words, e.g. no driver


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_build_folder_writes_the_extension_python_imports():
    """An editable install (make build) imports _C from the source tree, and
    its CMake build folder writes there: `cmake --build build/cmake` after an
    edit updates what the tests import. (A wheel's build folder refuses such a
    rebuild instead: tests/test_sdist.py.)"""
    if os.path.dirname(os.path.abspath(_C.__file__)) != os.path.join(ROOT, "hvdtorch"):
        pytest.skip(f"hvdtorch is installed, not editable from this tree ({_C.__file__})")
    cache = os.path.join(os.environ.get("HVDTORCH_BUILD_DIR", os.path.join(ROOT, "build", "cmake")), "CMakeCache.txt")
    with open(cache) as f:
        out = re.search(r"^HVDTORCH_EXT_OUTPUT_DIR:\w+=(.*)$", f.read(), re.M)
    assert out and os.path.realpath(out.group(1)) == os.path.realpath(os.path.dirname(_C.__file__)), (
        f"{cache} builds the extension into {out and out.group(1)}, but Python imports {_C.__file__}"
    )


def test_a_build_that_cannot_see_torch_says_what_to_type(tmp_path):
    # pip's build isolation hides the installed torch: one line naming --no-build-isolation, not a traceback.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, "setup.py")):
        pytest.skip("no setup.py beside tests/ (make test-cuda-build's copy of the tests): make test runs this")
    code = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['setup.py', 'build_ext', '--build-temp', {str(tmp_path)!r}]; "
        "runpy.run_path('setup.py', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("hvdtorch:")]
    assert len(lines) == 1 and "pip install --no-build-isolation ." in lines[0], out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
