"""A restore from Python is one call into the C++ core, which opens the item once: `_METADATA`,
`_sharding`, the OCDBT manifest and each array's zarr metadata are each read once (counted with
inotify, as the kernel sees the files opened)."""
import ctypes
import ctypes.util
import os
import struct

import numpy as np
import pytest

import tessel
from tessel import _tessel

IN_OPEN = 0x20
IN_NONBLOCK = 0o4000


class OpenCounter:
    """Counts the opens of the files in some directories (inotify IN_OPEN), by path."""

    def __init__(self, dirs):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.dirs = {}
        for d in dirs:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(d), IN_OPEN)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.dirs[wd] = d

    def opens(self):
        counts = {}
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, at)
                name = data[at + 16:at + 16 + length].rstrip(b"\0").decode()
                at += 16 + length
                if mask & IN_OPEN and name:
                    path = os.path.join(self.dirs[wd], name)
                    counts[path] = counts.get(path, 0) + 1
        return counts

    def close(self):
        os.close(self.fd)


def calls_into_core(monkeypatch):
    """Counts every call of a function of tessel._tessel (classes aside), by name."""
    counts = {}
    for name in dir(_tessel):
        f = getattr(_tessel, name)
        if name.startswith("_") or isinstance(f, type) or not callable(f):
            continue

        def counted(*args, _f=f, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _f(*args, **kwargs)

        monkeypatch.setattr(_tessel, name, counted)
    return counts


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_a_restore_is_one_call_that_reads_each_metadata_file_once(tmp_path, monkeypatch, use_ocdbt):
    mesh = tessel.Mesh({"data": 2, "fsdp": 4})
    tree = {"params": {"w": np.arange(64, dtype=np.float32).reshape(16, 4), "b": np.ones(8, np.float32)},
            "step": np.int32(3), "layers": [np.zeros((8, 2), np.float32), np.ones((8, 2), np.float32)]}
    path = str(tmp_path / "ckpt" / "7")
    tessel.checkpoint.save(path, tree, shardings={"params": {"w": tessel.P("fsdp")}}, mesh=mesh, use_ocdbt=use_ocdbt,
                           logical_axes={"params/w": ("embed", None)},
                           rules=tessel.LogicalRules([("embed", "fsdp")], ["data", "fsdp"]))
    arrays = [os.path.join(path, d) for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
    counter = OpenCounter([path] + arrays)
    counts = calls_into_core(monkeypatch)
    out = tessel.checkpoint.restore(str(tmp_path / "ckpt"), mesh=tessel.Mesh({"data": 4, "fsdp": 2}),
                                    select=["params.*", "layers.*"], rename={"params": "model"},
                                    shardings={"layers/1": tessel.P("data")})
    opens = counter.opens()
    counter.close()
    assert counts == {"restore": 1}, counts
    np.testing.assert_array_equal(out["model"]["w"].to_numpy(), tree["params"]["w"])
    assert out["layers"][1].sharding.spec == tessel.P("data")
    assert opens[os.path.join(path, "_METADATA")] == 1, opens
    assert opens[os.path.join(path, "_sharding")] == 1, opens
    if use_ocdbt:
        assert opens[os.path.join(path, "manifest.ocdbt")] == 1, opens
    else:
        zarrays = {p: n for p, n in opens.items() if p.endswith(".zarray")}
        assert len(zarrays) == 5 and set(zarrays.values()) == {1}, opens
