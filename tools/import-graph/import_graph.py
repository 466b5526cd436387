#!/usr/bin/env python3
"""The import graph of a crate's `src/`, one node per file, and its circles.

    python3 tools/import-graph/import_graph.py idem-core/src [-v]

An edge goes from a file to each file whose items it names by path: `use` trees and inline
`crate::`, `super::`, `self::` and child-module paths, with a path through a `pub use`
re-export followed to the file that defines the item, and paths inside inline modules
(`mod tests { .. }`) taken relative to them. Comments and strings are ignored, so doc links
are not edges. Prints the files, the edges, and every strongly connected component of more
than one file (a circle); `-v` also prints each file's edges.
"""
import os
import re
import sys


def modules(root):
    """Module path (tuple) -> file, relative to `root`."""
    mods = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                p = os.path.relpath(os.path.join(d, f), root)
                parts = p[:-3].split(os.sep)
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                mods[tuple(parts)] = p
    return mods


def code(src):
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"', '""', src)


def expand(prefix, tree):
    """The paths of a `use` tree (`a::{b, c::{d}}`), aliases dropped."""
    tree = tree.strip()
    m = re.match(r"^([\w:]*?)(::)?\{(.*)\}$", tree, re.S)
    if not m:
        return [prefix + [s for s in re.split(r"\s+as\s+", tree)[0].split("::") if s]]
    base = [s for s in m.group(1).split("::") if s]
    items, cur, depth = [], "", 0
    for ch in m.group(3) + ",":
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            if cur.strip():
                items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for it in items for p in expand(prefix + base, it)]


def graph(root):
    mods = modules(root)
    srcs = {mp: code(open(os.path.join(root, f)).read()) for mp, f in mods.items()}

    def absolute(here, p):
        if p[0] == "crate":
            return p[1:]
        if p[0] in ("super", "self"):
            ab, q = list(here), list(p)
            while q and q[0] in ("super", "self"):
                if q.pop(0) == "super":
                    ab = ab[:-1]
            return ab + q
        if tuple(here + [p[0]]) in mods:
            return here + p
        return None

    reexports = {}
    for mp, src in srcs.items():
        names = {}
        for u in re.finditer(r"\bpub(?:\([\w:]+\))?\s+use\s+([^;]+);", src):
            for p in expand([], u.group(1)):
                ab = absolute(list(mp), p)
                if ab and p[-1] != "self":
                    names[p[-1]] = ab
        reexports[mp] = names

    def resolve(ab, depth=0):
        for n in range(len(ab), -1, -1):
            m = tuple(ab[:n])
            if m in mods:
                if n < len(ab) and ab[n] in reexports[m] and depth < 10:
                    return resolve(reexports[m][ab[n]] + ab[n + 1:], depth + 1)
                return mods[m]
        return None

    edges = {}
    for mp, src in srcs.items():
        inline = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", src):
            depth, i = 1, m.end()
            while depth and i < len(src):
                depth += {"{": 1, "}": -1}.get(src[i], 0)
                i += 1
            inline.append((m.start(), i, m.group(1)))
        paths = [(u.start(), p) for u in re.finditer(r"\buse\s+([^;]+);", src)
                 for p in expand([], u.group(1))]
        paths += [(u.start(), u.group(1).split("::"))
                  for u in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", src)]
        targets = set()
        for pos, p in paths:
            here = list(mp) + [n for a, b, n in inline if a <= pos < b]
            ab = absolute(here, p) if p else None
            t = resolve(ab) if ab is not None else None
            if t and t != mods[mp]:
                targets.add(t)
        edges[mods[mp]] = targets
    return edges


def circles(edges):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    edges = graph(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-v" else "src")
    found = circles(edges)
    print(f"files: {len(edges)}, edges: {sum(len(e) for e in edges.values())}, "
          f"circles: {len(found)}, files in circles: {sum(len(c) for c in found)}")
    for c in found:
        print(f"  {len(c)}: " + " ".join(c))
    if "-v" in sys.argv:
        for f in sorted(edges):
            print(f, "->", " ".join(sorted(edges[f])))
