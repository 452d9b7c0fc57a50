"""python -m hvdtorch.timeline summarize trace.json [--plot out.png] [--json] (see hvdtorch/timeline_summary.py).

A package's __main__ rather than a block in __init__: hvdtorch imports hvdtorch.timeline at start-up, and
running an already imported module with -m would execute it a second time.
"""

import sys

from ..timeline_summary import main

sys.exit(main())
