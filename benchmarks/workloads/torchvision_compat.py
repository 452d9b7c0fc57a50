"""Whether torchvision can be used next to the installed torch.

torchvision's PyPI wheel is built against the CUDA build of torch; next to
the CPU build it fails at import with "operator torchvision::nms does not
exist" (a RuntimeError, not an ImportError). Callers fall back to the
models and readers of this package and may show the reason.
"""

import functools
from typing import Optional, Tuple


@functools.cache
def load() -> Tuple[Optional[object], str]:
    """(the torchvision module, "") where it imports, else (None, why not)."""
    try:
        import torchvision
        import torchvision.datasets  # noqa: F401
        import torchvision.models  # noqa: F401
        import torchvision.transforms  # noqa: F401
    except Exception as e:  # ImportError, or the RuntimeError of a mismatched build
        return None, f"torchvision does not import here ({type(e).__name__}: {str(e).splitlines()[0]})"
    return torchvision, ""
