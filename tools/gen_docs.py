#!/usr/bin/env python3
"""Writes the parts of the docs that are read from the code, so they cannot drift:

  docs/configuration.md  the knob table (hvdtorch.knobs(): name, default, meaning)
  docs/architecture.md   the file map of csrc/ and hvdtorch/ (each file with the first
                         sentence of its header comment or module docstring)

    python tools/gen_docs.py           # rewrite both blocks in place
    python tools/gen_docs.py --check   # exit 1, naming the block, if either is out of date

Each block sits between `<!-- generated:NAME -->` and `<!-- end:NAME -->` lines;
the text around it is written by hand. tests/test_docs.py runs --check.
"""

import argparse
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Folders of the file map, in the order of the layers (top to bottom), and the file kinds shown.
MAP_FOLDERS = ["hvdtorch", "csrc/torch", "csrc/core"]
SOURCE_SUFFIXES = (".py", ".h", ".cc", ".cpp", ".cu")


def knob_table() -> str:
    import hvdtorch

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, meaning in hvdtorch.knobs():
        shown = f"`{default}`" if default else "(empty)"
        rows.append(f"| `{name}` | {shown} | {meaning.replace('|', '/')} |")
    return "\n".join(rows)


# Words after which a period does not end a sentence.
ABBREVIATIONS = ("al.", "e.g.", "i.e.", "vs.", "etc.")


def first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for match in re.finditer(r"[.:;](\s|$)", text):
        head = text[: match.start() + 1]
        if not head.endswith(ABBREVIATIONS) and head.count("(") == head.count(")") and head.count("`") % 2 == 0:
            return head.rstrip(":;.")
    return text


def header_comment(path: str) -> str:
    """The first sentence of a C++ file's leading // comment, or of a Python module's docstring."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".py"):
        doc = ast.get_docstring(ast.parse(source)) or ""
        return first_sentence(doc)
    comment = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            comment.append(stripped.lstrip("/").strip())
        elif stripped or comment:
            break
    return first_sentence(" ".join(comment))


def file_map() -> str:
    """One line per source file; a .cc/.cpp/.cu beside a header of the same name is described by the header."""
    lines = ["```"]
    for top in MAP_FOLDERS:
        for folder, dirs, files in sorted(os.walk(os.path.join(ROOT, top))):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            names = sorted(f for f in files if f.endswith(SOURCE_SUFFIXES))
            stems_with_header = {os.path.splitext(f)[0] for f in names if f.endswith(".h")}
            shown = [f for f in names if f.endswith((".h", ".py")) or os.path.splitext(f)[0] not in stems_with_header]
            if not shown:
                continue
            lines.append(os.path.relpath(folder, ROOT) + "/")
            for name in shown:
                stem, ext = os.path.splitext(name)
                label = name if ext != ".h" else stem + ".h" + ("/.cc" if stem + ".cc" in names else "")
                what = header_comment(os.path.join(folder, name))
                lines.append(f"  {label:<28} {what}" if what else f"  {label}")
    lines.append("```")
    return "\n".join(lines)


BLOCKS = {"knobs": ("docs/configuration.md", knob_table), "file-map": ("docs/architecture.md", file_map)}


def replace_block(text: str, name: str, body: str, path: str) -> str:
    begin, end = f"<!-- generated:{name} -->", f"<!-- end:{name} -->"
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{path}: needs exactly one '{begin}' ... '{end}' block")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated block is out of date")
    args = parser.parse_args()
    stale = []
    for name, (rel, make) in BLOCKS.items():
        path = os.path.join(ROOT, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = replace_block(text, name, make(), rel)
        if new != text:
            stale.append(f"{rel} ({name})")
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if stale and args.check:
        print("out of date, run `python tools/gen_docs.py`: " + ", ".join(stale))
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale else "generated docs are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
