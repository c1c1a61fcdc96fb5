#!/usr/bin/env python3
"""Checks src/'s include graph against the layers of docs/architecture.md.

    python3 scripts/check_layers.py        # exits 1 listing every upward include

1. No layer includes one above it or beside it. Bottom up (ops/nn and checkpoint are siblings):
       core (with tessel/detail, its parsing helpers) -> sharding -> runtime -> state
         -> ops -> nn
         -> checkpoint
         -> models -> cli, python bindings
2. The checkpoint layer has levels of its own: detail/io (files, CRC-32C, threads) <
   detail/store (the key-value store, OCDBT, zarr, safetensors files, chunk lookup) < the rest of
   detail/ < its public headers. A file of a lower level includes nothing of a higher one. A
   public header that is a value type a lower level needs is placed at that level
   (LEVEL_OF_PUBLIC) and may include nothing above it either.
3. No header includes itself through others (a detail/ helper may use the value types of its
   layer, e.g. ops/detail/node.h uses ops/tensor.h, but never a header that includes it back).
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each layer may include (itself included).
BELOW = {
    "core": {"core"},
    "sharding": {"core", "sharding"},
    "runtime": {"core", "sharding", "runtime"},
    "state": {"core", "sharding", "runtime", "state"},
    "ops": {"core", "sharding", "runtime", "state", "ops"},
    "nn": {"core", "sharding", "runtime", "state", "ops", "nn"},
    "checkpoint": {"core", "sharding", "runtime", "state", "checkpoint"},
    "models": {"core", "sharding", "runtime", "state", "ops", "nn", "checkpoint", "models"},
    "cli": {"core", "sharding", "runtime", "state", "ops", "nn", "checkpoint", "models", "cli"},
    "python": {"core", "sharding", "runtime", "state", "ops", "nn", "checkpoint", "models", "python"},
}

# The checkpoint layer's levels: detail/io (0) < detail/store (1) < the rest of detail/ (2) < the
# public headers (PUBLIC_LEVEL).
LEVELS = [
    ("src/tessel/checkpoint/detail/io/", 0),
    ("src/tessel/checkpoint/detail/store/", 1),
    ("src/tessel/checkpoint/detail/", 2),
]
# Public headers that are value types a lower level needs (so they include nothing above it).
LEVEL_OF_PUBLIC = {
    "src/tessel/checkpoint/codec.h": 1,  # Compression: zarr's chunk codec and SaveOptions'
}
PUBLIC_LEVEL = 9

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path: str) -> str | None:
    if path.startswith("src/cli/"):
        return "cli"
    if path.startswith("python/src/"):
        return "python"
    m = re.match(r"src/tessel/([^/]+)/", path)
    if not m:
        return None
    return "core" if m.group(1) == "detail" else m.group(1)


def level_of(path: str) -> int:
    if path in LEVEL_OF_PUBLIC:
        return LEVEL_OF_PUBLIC[path]
    for prefix, level in LEVELS:
        if path.startswith(prefix):
            return level
    return PUBLIC_LEVEL


def resolve(include: str, source: str) -> str | None:
    for base in ("src", os.path.dirname(source)):
        candidate = os.path.normpath(os.path.join(base, include))
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def sources() -> list[str]:
    out = []
    for top in ("src", "python/src"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".h", ".cpp")):
                    out.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    return sorted(out)


def upward_edges() -> list[str]:
    problems = []
    for src in sources():
        layer = layer_of(src)
        if layer is None:
            problems.append(f"{src}: in no layer")
            continue
        text = open(os.path.join(ROOT, src), encoding="utf-8").read()
        for include in INCLUDE.findall(text):
            target = resolve(include, src)
            if target is None:
                continue  # a system or third-party header
            to = layer_of(target)
            if to not in BELOW[layer]:
                problems.append(f"{src} -> {target}: layer {layer} includes {to}, which is above it or beside it")
            elif to == layer and level_of(target) > level_of(src):
                problems.append(f"{src} -> {target}: a level-{level_of(src)} file of {layer} includes a "
                                f"level-{level_of(target)} header above it")
    return problems + header_cycles()


def header_cycles() -> list[str]:
    """Every header that reaches itself through the headers it includes."""
    graph = {}
    for src in sources():
        if src.endswith(".h"):
            text = open(os.path.join(ROOT, src), encoding="utf-8").read()
            graph[src] = [t for t in (resolve(i, src) for i in INCLUDE.findall(text)) if t and t.endswith(".h")]
    problems = []
    for start in sorted(graph):
        # Depth-first from start's includes, remembering the way back.
        parent = {}
        stack = list(graph[start])
        for t in stack:
            parent.setdefault(t, start)
        seen = set()
        while stack:
            node = stack.pop()
            if node == start:
                way, at = [start], parent[start]
                while at != start:
                    way.append(at)
                    at = parent[at]
                problems.append("header cycle: " + " -> ".join([start] + list(reversed(way[1:])) + [start]))
                break
            if node in seen:
                continue
            seen.add(node)
            for t in graph.get(node, []):
                parent.setdefault(t, node)
                stack.append(t)
    return problems


def main() -> int:
    problems = upward_edges()
    for p in problems:
        print(p)
    print(f"check_layers: {len(sources())} files, {len(problems)} upward includes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
