#!/usr/bin/env python3
"""Code metrics for issue 35's before/after: lines per crate, the biggest files, the longest
functions, the definitions of the search constants, and (where this workplace's `duplicates`
tool is installed) the duplicate pairs per crate.

    scripts/code-metrics.py [--top N] [--no-duplicates]

Reads the Rust files git tracks under core/, api/, extension/, coordinator/, gpu/, tools/ and
tests/ of the working tree; writes nothing. Lines are non-blank lines. A function's length
runs from its `fn` line to the line of its closing brace (found by counting braces outside
strings, chars and comments: good enough for ranking, not a parser).
"""

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

CRATES = ["core", "api", "extension", "coordinator", "gpu", "tools", "tests"]

# The concepts issue 35 wants defined once: (label, regex of a definition).
CONSTANTS = [
    ("iris threshold default", r"(const\s+DEFAULT_(TAU|THRESHOLD)\w*\s*:|default_value_t\s*=\s*0\.345|default!\(f64,\s*0\.345\))"),
    ("maximum rotation", r"const\s+MAX_ROTATION\w*\s*:"),
    ("Paillier protocol enum", r"enum\s+\w*Protocol\s*\{"),
    ("Paillier protocol names spelled as strings", r'"(pi[123]|semi[-_]honest|no[-_]leakage)"'),
]

FN_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def tracked_rust_files(root: Path) -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--", *[f"{c}/*.rs" for c in CRATES]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(root / p for p in out if (root / p).is_file())


def strip_literals(line: str, in_block: bool) -> tuple[str, bool]:
    """The line without string and char literals and comments; whether a block comment is
    still open at its end."""
    out = []
    i = 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_block = end + 2, False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            in_block, i = True, i + 2
            continue
        if c == '"':
            j = i + 1
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            i = j + 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out), in_block


def functions(path: Path) -> list[tuple[int, str, int]]:
    """(length in lines, name, first line) of every fn with a body in `path`."""
    lines = path.read_text(errors="replace").splitlines()
    found = []
    stack = []  # (name, start line, depth at which its body opened)
    depth = 0
    in_block = False
    pending = None  # a fn seen whose body has not opened yet
    for n, raw in enumerate(lines, 1):
        code, in_block = strip_literals(raw, in_block)
        m = FN_RE.match(code)
        if m:
            pending = (m.group(7), n)
        for c in code:
            if c == "{":
                depth += 1
                if pending:
                    stack.append((pending[0], pending[1], depth))
                    pending = None
            elif c == "}":
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    found.append((n - start + 1, name, start))
                depth -= 1
            elif c == ";" and pending:
                pending = None  # a declaration without a body
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--no-duplicates", action="store_true")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    files = tracked_rust_files(root)
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                           capture_output=True, text=True).stdout.strip()
    print(f"tree: {rev}{' (with uncommitted changes)' if dirty else ''}; {len(files)} Rust files")

    print("\nnon-blank lines per crate (production files / tests and examples):")
    sizes = {}
    for f in files:
        rel = f.relative_to(root)
        n = sum(1 for line in f.read_text(errors="replace").splitlines() if line.strip())
        sizes[rel] = n
    for crate in CRATES:
        in_crate = {p: n for p, n in sizes.items() if p.parts[0] == crate}
        prod = sum(n for p, n in in_crate.items() if "src" in p.parts and "tests" not in p.parts[1:])
        print(f"  {crate:12} {sum(in_crate.values()):7} ({prod} under src/, {len(in_crate)} files)")

    print(f"\nthe {args.top} biggest files (non-blank lines):")
    for rel, n in sorted(sizes.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {n:6}  {rel}")

    print(f"\nthe {args.top} longest functions (lines, fn line to closing brace):")
    fns = []
    for f in files:
        for length, name, start in functions(f):
            fns.append((length, f"{f.relative_to(root)}:{start}", name))
    for length, where, name in sorted(fns, reverse=True)[: args.top]:
        print(f"  {length:5}  {name}  ({where})")
    print(f"  functions over 100 lines: {sum(1 for f in fns if f[0] > 100)}; over 60: "
          f"{sum(1 for f in fns if f[0] > 60)}; of {len(fns)}")

    print("\ndefinitions of the search constants (want: one each):")
    for label, pattern in CONSTANTS:
        rx = re.compile(pattern)
        hits = []
        for f in files:
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if rx.search(line) and not line.lstrip().startswith("//"):
                    hits.append(f"{f.relative_to(root)}:{n}: {line.strip()[:90]}")
        print(f"  {label}: {len(hits)}")
        for h in hits:
            print(f"    {h}")

    if args.no_duplicates:
        return 0
    tool = shutil.which("duplicates")
    if not tool:
        print("\nduplicates per crate: the `duplicates` tool is not installed here (skipped)")
        return 0
    print("\nduplicate pairs per crate (`duplicates --repo <crate> --most 200`):")
    for crate in CRATES:
        out = subprocess.run([tool, "--repo", str(root / crate), "--most", "200", "--seconds", "120"],
                             capture_output=True, text=True).stdout
        first = out.splitlines()[0] if out else "(no output)"
        print(f"  {crate:12} {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
