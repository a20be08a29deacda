#!/usr/bin/env python3
"""Import circles between the modules of a crate: which file-modules name each other, directly
or through others, leaving out a module's references to its own ancestors and descendants
(`super::` items and `mod` declarations are how Rust nests, not circles).

Usage: scripts/module-cycles.py [--layers] [crates/rdmapool-pool/src]   (one crate's src; CI runs it on each)

Exits 1 when two modules (files) form a circle; with --layers, also when two top-level
modules (the layers: fabric, mr, metrics, ...) do, counting every file under each.

A module is a file (`conn/pending.rs` is `conn::pending`, `conn/mod.rs` is `conn`). A path in
code (`crate::a::b::Item`, `super::x`, `use crate::{a, b::c}`), outside comments, string
literals and `#[cfg(test)]` test modules (in a file, or files declared under `#[cfg(test)]`),
is an edge to the longest module that prefixes it.
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
root = args[0] if args else "crates/rdmapool-pool/src"
mods = {}  # module path tuple -> file
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(d, f), root)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib"):
            rel = rel[:-1]
        mods[tuple(rel)] = os.path.join(d, f)


def code_of(text):
    """The text without comments, string literals and test modules."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'(?<![A-Za-z0-9_])r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    # Unit-test modules inside a file: `#[cfg(test)] mod tests { ... }` to the end.
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    if m:
        text = text[: m.start()]
    return text


def expand_use(body):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (a use tree, without `as`)."""
    body = re.sub(r"\s+", "", body)
    out = []

    def walk(prefix, s):
        i = s.find("{")
        if i < 0:
            for part in s.split(","):
                if part:
                    out.append(prefix + part.split("as")[0] if "as" not in part else prefix + part[: part.index("as")])
            return
        head = s[:i]
        depth, j = 0, i
        for j in range(i, len(s)):
            depth += s[j] == "{"
            depth -= s[j] == "}"
            if depth == 0:
                break
        inner, rest = s[i + 1 : j], s[j + 1 :].lstrip(",")
        items, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        items.append(cur)
        for it in items:
            if it:
                walk(prefix + head, it)
        if rest:
            walk(prefix, rest)

    walk("", body)
    return out


def resolve(me, path):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] == "super":
        base = list(me)
        while parts and parts[0] == "super":
            base = base[:-1]
            parts = parts[1:]
    elif parts[0] == "self":
        base, parts = list(me), parts[1:]
    else:
        return None
    full = base + [p for p in parts if p and p != "self"]
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in mods:
            return tuple(full[:n])
    return None


# Modules declared under `#[cfg(test)]` in their parent's file (`#[cfg(test)] mod sim;`,
# `#[cfg(test)] mod tests;`) are test code, as the in-file test modules are: left out with
# everything under them.
test_mods = set()
for m, f in mods.items():
    for t in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", open(f).read()):
        test_mods.add(m + (t.group(1),))
mods = {m: f for m, f in mods.items() if not any(m[: len(t)] == t for t in test_mods)}

edges = {m: set() for m in mods}
for m, f in mods.items():
    code = code_of(open(f).read())
    paths = []
    for u in re.finditer(r"\buse\s+([^;]+);", code):
        paths += expand_use(u.group(1))
    paths += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", code)
    for p in paths:
        t = resolve(m, p.replace(" ", ""))
        if t is None or t == m or t == m[: len(t)] or m == t[: len(m)]:
            continue
        edges[m].add(t)

def circles(edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


sys.setrecursionlimit(10000)
name = lambda m: "::".join(m) or "crate"


def report(edges, what):
    found = circles(edges)
    for comp in found:
        cs = set(comp)
        print("circle: " + ", ".join(name(c) for c in comp))
        for a in comp:
            for b in sorted(edges[a] & cs):
                print(f"  {name(a)} -> {name(b)}")
    print(f"{len(found)} circle(s) among {len(edges)} {what}")
    return found


files = report(edges, "modules")
# The layers: the crate's top-level modules, each with everything under it.
layers = {}
for a, ts in edges.items():
    la = a[:1]
    layers.setdefault(la, set())
    for b in ts:
        if b[:1] != la:
            layers[la].add(b[:1])
for t in list(layers.values()):
    for b in t:
        layers.setdefault(b, set())
print()
top = report(layers, "top-level modules (layers)")

if __name__ == "__main__":
    strict = "--layers" in sys.argv
    sys.exit(1 if files or (strict and top) else 0)
