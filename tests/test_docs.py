"""The docs' generated parts match the code: docs/configuration.md's knob table
is hvdtorch.knobs(), and docs/architecture.md's file map lists every source
file with its header comment (tools/gen_docs.py writes both)."""

import os
import subprocess
import sys

from tests.harness import ROOT


def test_generated_docs_are_up_to_date():
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_knob_the_code_reads_is_in_the_table():
    import hvdtorch

    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        page = f.read()
    table = page.split("<!-- generated:knobs -->")[1].split("<!-- end:knobs -->")[0]
    names = [name for name, _, _ in hvdtorch.knobs()]
    assert names and all(f"`{n}`" in table for n in names)
    assert "HVDTORCH_ELASTIC_DIR" in names  # read in Python (hvdtorch/elastic/state.py), listed all the same
