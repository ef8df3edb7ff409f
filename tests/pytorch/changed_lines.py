#!/usr/bin/python3
"""Counts the lines of code two Python scripts differ by: their module docstrings, comments and
blank lines left out, each block of the diff counted as the larger of its two sides (a line
changed counts once, not as one removed and one added). Prints the count and the diff.

usage: changed_lines.py PLAIN ELASTIC
"""

import ast
import difflib
import io
import sys
import tokenize


def code_lines(path):
    source = open(path).read()
    skip = set()
    tree = ast.parse(source)
    doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) and \
        isinstance(getattr(tree.body[0], "value", None), ast.Constant) else None
    if doc is not None:
        skip.update(range(doc.lineno, doc.end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.line.strip().startswith("#"):
            skip.add(tok.start[0])
    out = []
    for number, line in enumerate(source.splitlines(), 1):
        if number in skip or not line.strip():
            continue
        code = line.split("  #")[0].rstrip()  # a trailing comment is not code
        out.append(code)
    return out


def main(plain, elastic):
    a, b = code_lines(plain), code_lines(elastic)
    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        changed += max(i2 - i1, j2 - j1)
        for line in a[i1:i2]:
            print("- " + line)
        for line in b[j1:j2]:
            print("+ " + line)
    print("changed lines of code: %d" % changed)
    return changed


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
