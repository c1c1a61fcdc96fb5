#!/usr/bin/env python3
"""Reads an OCDBT database tessel wrote (tests/checkpoint/ocdbt_sample.cpp) with the independent
reference reader in ../shared/tools/ocdbt_dump.py (written from TensorStore's spec; checks every
CRC-32C), raw and zstd-compressed (the reader decodes zstd with the `zstd` tool).
Usage: ocdbt_crosscheck.py OCDBT_SAMPLE TOOLS_DIR"""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

sample, tools = sys.argv[1], sys.argv[2]
path = os.path.join(tools, "ocdbt_dump.py")
if not os.path.exists(path):
    sys.exit(f"the reference OCDBT reader {path} is missing")
if not shutil.which("zstd"):
    sys.exit("the zstd tool is missing (scripts/install-deps.sh test installs it)")
spec = importlib.util.spec_from_file_location("ocdbt_dump", path)
dump = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dump)

expected = {}
for i in range(200):
    expected[f"p{i % 7}/c/{i}".encode()] = bytes([ord("a") + i % 26]) * (1500 if i % 3 == 0 else 10)

for zstd in ("0", "1"):
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "db")
        subprocess.run([sample, db, zstd], check=True)
        with open(os.path.join(db, "manifest.ocdbt"), "rb") as f:
            m = dump.decode_manifest(f.read())
        v = m["versions"][-1]
        assert v["root_height"] >= 2, v
        assert v["num_keys"] == 200, v
        entries = dump.walk(db, v, v["root_height"], out=[])
        got = {}
        for key, e in entries:
            got[key] = e["value"] if e["kind"] == 0 else dump.read_range(db, e["file"], e["offset"], e["length"])
            assert (e["kind"] == 1) == (len(got[key]) > 1024), key
        assert [k for k, _ in entries] == sorted(expected), "keys differ or are out of order"
        assert got == expected, "values differ"
        print(f"zstd={zstd}: {len(entries)} keys, height {v['root_height']}, read back by the reference reader")
