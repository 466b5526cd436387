#!/usr/bin/env python3
"""Renders the guide's sequence diagrams to SVG, so rustdoc shows them without JavaScript.

The diagrams are written in a small subset of mermaid's `sequenceDiagram` (the `.mmd`
files in src/guide/diagrams/, which GitHub and mermaid's own tools also read):

    participant A as Label      a column, in the order declared
    A->>B: text                 a call (solid arrow)
    A-->>B: text                an answer (dashed arrow)
    A-xB: text                  a step that fails or never arrives (a cross at its end)
    Note over A: text           a note on one column, or `Note over A,B` across several
    Note right of A: text       a note beside a column
    %% comment                  ignored

Usage: python3 tools/seqdiag/seqdiag.py [src/guide/diagrams]   (rewrites every .svg)
       python3 tools/seqdiag/seqdiag.py --check [dir]          (fails if an .svg is stale)

Only the standard library: the output depends on nothing but the .mmd text, so the same
source gives the same bytes on every machine.
"""
import html
import re
import sys
from pathlib import Path

FONT = 14
CHAR_W = 7.4          # an estimate of a character's width at FONT in a sans-serif face
COL_MIN = 150         # the least distance between two columns
BOX_H = 34
ROW = 40              # vertical space for one message
NOTE_PAD = 8
MARGIN = 20

ARROW = re.compile(r"^(\w+)\s*(-->>|->>|-x|--x)\s*(\w+)\s*:\s*(.*)$")
NOTE = re.compile(r"^Note\s+(over|right of|left of)\s+([\w,\s]+?)\s*:\s*(.*)$", re.I)
PARTICIPANT = re.compile(r"^(?:participant|actor)\s+(\w+)(?:\s+as\s+(.*))?$")


def text_w(s):
    return len(s) * CHAR_W


def parse(src):
    names, labels, steps = [], {}, []
    lines = [l.strip() for l in src.splitlines()]
    if not lines or lines[0] != "sequenceDiagram":
        raise SystemExit("a diagram starts with `sequenceDiagram`")
    for n, line in enumerate(lines[1:], 2):
        if not line or line.startswith("%%"):
            continue
        if m := PARTICIPANT.match(line):
            names.append(m[1])
            labels[m[1]] = m[2] or m[1]
        elif m := ARROW.match(line):
            for who in (m[1], m[3]):
                if who not in labels:
                    raise SystemExit(f"line {n}: undeclared participant {who}")
            steps.append(("msg", m[1], m[2], m[3], m[4]))
        elif m := NOTE.match(line):
            who = [w.strip() for w in m[2].split(",")]
            steps.append(("note", m[1].lower(), who, m[3]))
        else:
            raise SystemExit(f"line {n}: not in the subset: {line}")
    return names, labels, steps


def layout_columns(names, labels, steps):
    """Column centres: wide enough for each box and each label between neighbours."""
    idx = {n: i for i, n in enumerate(names)}
    gaps = [COL_MIN] * (len(names) - 1)
    for i in range(len(names) - 1):
        need = (text_w(labels[names[i]]) + text_w(labels[names[i + 1]])) / 2 + 40
        gaps[i] = max(gaps[i], need)
    for s in steps:
        if s[0] == "msg" and s[1] != s[3]:
            a, b = sorted((idx[s[1]], idx[s[3]]))
            need = text_w(s[4]) + 30
            have = sum(gaps[a:b])
            if need > have:
                extra = (need - have) / (b - a)
                for i in range(a, b):
                    gaps[i] += extra
    first = max(text_w(labels[names[0]]) / 2 + 16, 60) + MARGIN
    xs = [first]
    for g in gaps:
        xs.append(xs[-1] + g)
    right = xs[-1] + max(text_w(labels[names[-1]]) / 2 + 16, 60) + MARGIN
    # notes to the right of the last column widen the picture
    for s in steps:
        if s[0] == "note" and s[1] == "right of":
            right = max(right, xs[idx[s[2][0]]] + 14 + text_w(s[3]) + 2 * NOTE_PAD + MARGIN)
    return xs, right


def esc(s):
    return html.escape(s, quote=True)


def render(src):
    names, labels, steps = parse(src)
    idx = {n: i for i, n in enumerate(names)}
    xs, width = layout_columns(names, labels, steps)
    out = []
    right_edge = width  # a note may reach past the last column: the picture grows to hold it
    y = MARGIN + BOX_H + 20
    for s in steps:
        if s[0] == "msg":
            _, a, kind, b, label = s
            xa, xb = xs[idx[a]], xs[idx[b]]
            dashed = kind.startswith("--")
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            y += 22
            if a == b:
                out.append(f'<path d="M{xa:.0f} {y}h40v18h-40" fill="none" stroke="#333" stroke-width="1.5"{dash} marker-end="url(#arrow)"/>')
                out.append(f'<text x="{xa + 46:.0f}" y="{y + 13}" font-size="{FONT}">{esc(label)}</text>')
                y += 30
                continue
            sign = 1 if xb > xa else -1
            end = xb - sign * 2
            marker = "" if kind.endswith("x") else ' marker-end="url(#arrow)"'
            out.append(f'<text x="{(xa + xb) / 2:.0f}" y="{y - 6}" font-size="{FONT}" text-anchor="middle">{esc(label)}</text>')
            out.append(f'<line x1="{xa:.0f}" y1="{y}" x2="{end:.0f}" y2="{y}" stroke="#333" stroke-width="1.5"{dash}{marker}/>')
            if kind.endswith("x"):
                cx = xb - sign * 8
                out.append(f'<path d="M{cx - 6:.0f} {y - 6}l12 12m0 -12l-12 12" stroke="#c0392b" stroke-width="2.5"/>')
            y += ROW - 22
        else:
            _, where, who, label = s
            w = text_w(label) + 2 * NOTE_PAD
            h = FONT + 2 * NOTE_PAD
            cols = [xs[idx[n]] for n in who]
            if where == "over":
                lo, hi = min(cols), max(cols)
                w = max(w, hi - lo + 60)
                x = (lo + hi) / 2 - w / 2
            elif where == "right of":
                x = cols[0] + 14
            else:
                x = cols[0] - 14 - w
            x = max(x, MARGIN / 2)
            right_edge = max(right_edge, x + w + MARGIN / 2)
            y += 8
            out.append(f'<rect x="{x:.0f}" y="{y}" width="{w:.0f}" height="{h}" rx="3" fill="#fff5c2" stroke="#c9a227"/>')
            out.append(f'<text x="{x + w / 2:.0f}" y="{y + NOTE_PAD + FONT - 3}" font-size="{FONT}" text-anchor="middle">{esc(label)}</text>')
            y += h + 8
    y += 16
    width = right_edge
    height = y + BOX_H + MARGIN
    head = []
    for n, x in zip(names, xs):
        bw = max(text_w(labels[n]) + 24, 90)
        head.append(f'<line x1="{x:.0f}" y1="{MARGIN + BOX_H}" x2="{x:.0f}" y2="{y}" stroke="#999" stroke-width="1" stroke-dasharray="3 3"/>')
        for top in (MARGIN, y):
            head.append(f'<rect x="{x - bw / 2:.0f}" y="{top}" width="{bw:.0f}" height="{BOX_H}" rx="4" fill="#e8eefc" stroke="#4a6fb5"/>')
            head.append(f'<text x="{x:.0f}" y="{top + BOX_H / 2 + 5}" font-size="{FONT}" text-anchor="middle" font-weight="bold">{esc(labels[n])}</text>')
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" fill="#222" role="img">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="#333"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#fff"/>',
        *head,
        *out,
        "</svg>",
    ]
    # One line per element and no blank line: rustdoc's Markdown passes the whole SVG
    # through as one HTML block only while no line is empty.
    return "\n".join(svg) + "\n"


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "src/guide/diagrams"
    stale = []
    for mmd in sorted(root.glob("*.mmd")):
        svg_path = mmd.with_suffix(".svg")
        svg = render(mmd.read_text())
        if check:
            if not svg_path.exists() or svg_path.read_text() != svg:
                stale.append(svg_path.name)
        else:
            svg_path.write_text(svg)
            print(f"wrote {svg_path}")
    if stale:
        raise SystemExit(f"stale (run tools/seqdiag/seqdiag.py): {', '.join(stale)}")


if __name__ == "__main__":
    main(sys.argv[1:])
