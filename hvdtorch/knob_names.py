"""Which HVDTORCH_* variables hvdtorch reads at run time (the knobs), and
the check of what a job sets: init() warns once about a variable that is no
knob (a typo: HVDTORCH_TIMEOUTS=5 is silently the default otherwise),
naming the closest knob, and refuses an option of its own that is none;
`python -m hvdtorch.check` lists the same ones (hvdtorch/check.py). The
knobs' values are checked by the one parser of them (csrc/core/config,
through _C.resolve_options).

Variables that the build, the demo and the test harness read are not knobs
and are not warned about (BUILD_AND_TEST)."""

import difflib
from typing import Iterable, List, Optional, Tuple

# Knobs outside the engine's Config (whose knobs _C.knobs() lists): read in Python only.
PYTHON_KNOBS = [
    (
        "HVDTORCH_ELASTIC_DIR",
        "",
        "where hvd.elastic states commit (TorchState(commit_dir=...) overrides); empty: commits in memory only",
    ),
]

# Read by setup.py and CMake (HVDTORCH_BUILD_*, HVDTORCH_CUDA, HVDTORCH_SANITIZE, HVDTORCH_SETUP_BUILD), the demo
# and the test harness (HVDTORCH_TEST_*), not by a running job.
BUILD_AND_TEST_PREFIXES = ("HVDTORCH_BUILD_", "HVDTORCH_TEST_")
BUILD_AND_TEST = {"HVDTORCH_CUDA", "HVDTORCH_SANITIZE", "HVDTORCH_SETUP_BUILD", "HVDTORCH_DEMO_QUICK"}


def knobs() -> List[Tuple[str, str, str]]:
    """Every HVDTORCH_* knob as (name, default, meaning)."""
    from . import _C

    return list(_C.knobs()) + PYTHON_KNOBS


def closest(name: str, names: Iterable[str]) -> Optional[str]:
    match = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_variables(env) -> List[Tuple[str, Optional[str]]]:
    """(variable, the closest knob or None) for every HVDTORCH_* variable of
    ``env`` that is neither a knob nor a build or test variable."""
    known = [name for name, _, _ in knobs()]
    out = []
    for name in sorted(env):
        if not name.startswith("HVDTORCH_") or name in known or name in BUILD_AND_TEST:
            continue
        if name.startswith(BUILD_AND_TEST_PREFIXES):
            continue
        out.append((name, closest(name, known)))
    return out


def check_option_names(options) -> None:
    """init(**options): a key that names no knob raises, naming the closest."""
    known = {name[len("HVDTORCH_") :].lower(): name for name, _, _ in knobs()}
    for key in options:
        if str(key).lower() in known:
            continue
        near = closest(str(key).lower(), known)
        hint = f"; did you mean {near}= (HVDTORCH_{near.upper()})?" if near else ""
        raise ValueError(f"hvdtorch: init({key}=...): no such option{hint} (python -m hvdtorch.check lists them)")
