"""Entry point of one rank started by tests/harness.py: python -m tests.rank_main module:function [args]."""

import importlib
import sys
import traceback


def main() -> int:
    module, func = sys.argv[1].split(":")
    fn = getattr(importlib.import_module(module), func)
    try:
        fn(*sys.argv[2:])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
