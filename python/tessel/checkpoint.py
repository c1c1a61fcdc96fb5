"""Orbax PyTree checkpoints from Python: save NumPy or JAX trees, restore onto any mesh.

    >>> import numpy as np, tessel
    >>> mesh = tessel.Mesh({"data": 2, "fsdp": 4})
    >>> tree = {"w": np.ones((16, 8), np.float32), "layers": [np.zeros(4, np.int32)]}
    >>> tessel.checkpoint.save("/tmp/ckpt/7", tree,
    ...     shardings={"w": tessel.NamedSharding(mesh, tessel.P("fsdp"))}, mesh=mesh)
    >>> again = tessel.checkpoint.restore("/tmp/ckpt/7", mesh=tessel.Mesh({"x": 8}))
    >>> again["w"].shards[3].data          # device 3's block, read straight from disk
    >>> again["w"].to_numpy()             # the whole array, when wanted

The layout is Orbax's (by default zarr v2 arrays in an OCDBT database), so Orbax, TensorStore and
tessel's C++ API and CLI read what this writes, and this reads what they write.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tessel import _tessel
from tessel._jax import from_jax, to_jax
from tessel._job import Job, Meeting, jax_device_ids
from tessel._tessel import ArgumentError, LogicalRules, Mesh, NamedSharding, PartitionSpec

SEQUENCE_KEY = 1  # Orbax's KeyType.SEQUENCE: the key is a list/tuple index


_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _ml_dtype(name: str):
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"{name} arrays need ml_dtypes: pip install 'tessel[bf16]'") from e
    return getattr(ml_dtypes, name)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a tessel dtype name (bfloat16 and the float8 types are ml_dtypes')."""
    return np.dtype(_ml_dtype(name)) if name in _ML_DTYPES else np.dtype(name)


@dataclass(frozen=True)
class Shard:
    """One device's block of a restored array: a read-only view of the bytes restore wrote."""

    device: int
    index: tuple  # of slices, as JAX's Shard.index
    replica_id: int
    data: np.ndarray


@dataclass(frozen=True)
class ShardedArray:
    """A restored array: its global shape, dtype and sharding, and one Shard per device."""

    shape: tuple
    dtype: np.dtype
    sharding: NamedSharding
    shards: tuple

    @property
    def addressable_shards(self) -> tuple:
        return self.shards

    def to_numpy(self) -> np.ndarray:
        """The whole array, assembled from the replica-0 blocks (a copy). In a multi-process job
        only when this process holds every block."""
        out = np.empty(self.shape, self.dtype)
        covered = 0
        for s in self.shards:
            if s.replica_id == 0:
                out[s.index] = s.data
                covered += s.data.size
        if covered != int(np.prod(self.shape, dtype=np.int64)):
            raise ArgumentError(f"this process holds {covered} of the array's {int(np.prod(self.shape))} elements "
                                "(the others are other processes' blocks): use to_jax() or its shards")
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def to_jax(self, jax_sharding: Any = None) -> Any:
        """A jax.Array with the same sharding: each device receives its own block only."""
        import jax

        sharding = jax_sharding if jax_sharding is not None else to_jax(self.sharding)
        by_id = {d.id: d for d in sharding.addressable_devices}
        blocks = []
        for s in self.shards:
            device = by_id.get(s.device) if len(sharding.device_set) > 1 else next(iter(sharding.device_set))
            if device is None:  # another process's device: it makes its own block
                continue
            # tessel's buffers are 64-byte aligned, so JAX's CPU client takes them as they are
            # (no second copy); the block's view keeps tessel's buffer alive inside JAX's.
            blocks.append(jax.device_put(s.data, device))
        return jax.make_array_from_single_device_arrays(self.shape, sharding, blocks)


# ---------------------------------------------------------------------------------------------
# Trees


def _key(k: Any, where: str) -> str:
    if isinstance(k, bool) or not isinstance(k, (str, int)):
        raise ArgumentError(f"{where or 'the tree'}: key {k!r} is not a str or int")
    s = str(k)
    if not s or "/" in s:
        raise ArgumentError(f"{where or 'the tree'}: key {s!r} is empty or contains '/'")
    return s


def _is_leaf(x: Any) -> bool:
    return not isinstance(x, (dict, list, tuple))


def _flatten(tree: Any, prefix: str = "", leaves: dict | None = None, sequences: set | None = None,
             is_leaf=_is_leaf) -> tuple[dict, set]:
    """{'/'-joined path: leaf} in tree order, and the paths of the list/tuple nodes."""
    leaves = {} if leaves is None else leaves
    sequences = set() if sequences is None else sequences
    if is_leaf(tree):
        if not prefix:
            raise ArgumentError("the tree is a single leaf: give a dict or a list of arrays")
        leaves[prefix] = tree
    elif isinstance(tree, Mapping):
        for k, v in tree.items():
            key = _key(k, prefix)
            _flatten(v, f"{prefix}/{key}" if prefix else key, leaves, sequences, is_leaf)
    else:
        sequences.add(prefix)
        for i, v in enumerate(tree):
            _flatten(v, f"{prefix}/{i}" if prefix else str(i), leaves, sequences, is_leaf)
    return leaves, sequences


def _flat_map(tree: Any, is_leaf) -> dict:
    """A tree of per-leaf values (shardings, logical axes) by path; a flat {path: value} dict works too."""
    if tree is None:
        return {}
    out: dict = {}

    def walk(t, prefix):
        if is_leaf(t) or not isinstance(t, (Mapping, list, tuple)):
            out[prefix] = t
        elif isinstance(t, Mapping):
            for k, v in t.items():
                walk(v, f"{prefix}/{k}" if prefix else str(k))
        else:
            for i, v in enumerate(t):
                walk(v, f"{prefix}/{i}" if prefix else str(i))

    walk(tree, "")
    return out


def _unflatten(values: dict, key_types: dict) -> dict | list:
    """The nested tree of {path: value}; nodes whose keys Orbax recorded as sequence indices 0..n-1
    become lists."""
    root: dict = {}
    for path, value in values.items():
        node = root
        keys = path.split("/")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    def fix(node, path):
        if not isinstance(node, dict):
            return node
        node = {k: fix(v, f"{path}/{k}" if path else k) for k, v in node.items()}
        if node and key_types.get(path) == SEQUENCE_KEY and sorted(node) == sorted(map(str, range(len(node)))):
            return [node[str(i)] for i in range(len(node))]
        return node

    return fix(root, "")


# ---------------------------------------------------------------------------------------------
# Shardings given by users


def _is_sharding_leaf(x: Any) -> bool:
    return isinstance(x, (NamedSharding, PartitionSpec)) or hasattr(x, "sharding") or type(x).__module__.startswith(
        ("jax", "jaxlib"))


def _as_sharding(value: Any, mesh: Mesh | None, where: str) -> tuple[NamedSharding, Any, Any]:
    """(tessel sharding, the JAX sharding if one was given, the dtype if one was given)."""
    dtype = None
    jax_sharding = None
    if hasattr(value, "sharding") and hasattr(value, "dtype") and not isinstance(value, np.ndarray):
        dtype = value.dtype  # a jax.ShapeDtypeStruct or jax.Array: Orbax's restore target
        value = value.sharding
    if isinstance(value, NamedSharding):
        return value, None, dtype
    if isinstance(value, PartitionSpec):
        if mesh is None:
            raise ArgumentError(f"{where}: a PartitionSpec needs mesh=")
        return NamedSharding(mesh, value), None, dtype
    if type(value).__module__.startswith(("jax", "jaxlib")):
        converted = from_jax(value)
        if isinstance(converted, PartitionSpec):
            if mesh is None:
                raise ArgumentError(f"{where}: a PartitionSpec needs mesh=")
            return NamedSharding(mesh, converted), None, dtype
        jax_sharding = value
        return converted, jax_sharding, dtype
    raise ArgumentError(f"{where}: {value!r} is not a NamedSharding, PartitionSpec or jax sharding")


# ---------------------------------------------------------------------------------------------
# Save


def _dtype_name(dtype: np.dtype, where: str) -> str:
    name = np.dtype(dtype).name
    if np.dtype(dtype).byteorder == ">":
        raise ArgumentError(f"{where}: big-endian {dtype} is not supported")
    return name


def _raw(block: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous block as a 1-D uint8 array (no copy)."""
    return np.ascontiguousarray(block).reshape(-1).view(np.uint8)


def _record(path: str, dtype: str, shape, sharding: NamedSharding, blocks: list, logical: Any) -> dict:
    """What the binding saves of one leaf: each block as (start, shape, raw bytes)."""
    return {"path": path, "dtype": dtype, "shape": tuple(shape), "sharding": sharding, "blocks": blocks,
            "logical_axes": logical}


def _leaf_record(path: str, leaf: Any, sharding_value: Any, mesh: Mesh | None, logical: Any,
                 local: frozenset | None = None) -> dict:
    """One leaf's record: the distinct blocks this process writes (in a job, `local` holds its
    devices' ids: the blocks whose replica 0 is there)."""
    if leaf is None:
        raise ArgumentError(f"'{path}': None leaves are not saved; drop them from the tree")
    if type(leaf).__module__.startswith(("jax", "jaxlib")) and hasattr(leaf, "addressable_shards"):
        if sharding_value is not None:
            raise ArgumentError(f"'{path}' is a jax.Array: it is saved with its own sharding, not one from shardings=")
        sharding = from_jax(leaf.sharding)
        blocks = []
        for s in leaf.addressable_shards:
            if s.replica_id != 0:
                continue
            data = np.asarray(s.data)
            start = tuple(0 if sl.start is None else sl.start for sl in s.index)
            blocks.append((start, data.shape, _raw(data)))
        return _record(path, _dtype_name(leaf.dtype, path), leaf.shape, sharding, blocks, logical)
    if isinstance(leaf, ShardedArray):  # restored by tessel: its blocks as they are, no copy
        if sharding_value is not None:
            raise ArgumentError(f"'{path}' is a restored ShardedArray: it is saved with its own sharding")
        blocks = [(tuple(sl.start for sl in s.index), s.data.shape, _raw(s.data)) for s in leaf.shards
                  if s.replica_id == 0]
        return _record(path, _dtype_name(leaf.dtype, path), leaf.shape, leaf.sharding, blocks, logical)
    array = np.asarray(leaf)
    if sharding_value is not None:
        sharding = _as_sharding(sharding_value, mesh, f"'{path}'")[0]
    elif mesh is not None:
        sharding = NamedSharding(mesh, PartitionSpec())
    else:
        sharding = NamedSharding(Mesh([("device", 1)]), PartitionSpec())
    blocks = []
    for device, index in sharding.devices_indices_map(array.shape).items():
        if sharding.replica_id(device) == 0 and (local is None or device in local):
            block = array[index]
            blocks.append((tuple(sl.start for sl in index), block.shape, _raw(block)))
    return _record(path, _dtype_name(array.dtype, path), array.shape, sharding, blocks, logical)


def save(path: str, tree: Any, *, shardings: Any = None, mesh: Mesh | None = None,
         logical_axes: Any = None, rules: LogicalRules | None = None, compression: str = "none",
         use_ocdbt: bool = True, use_zarr3: bool = False, max_chunk_bytes: int = 64 << 20,
         timeout_s: float = 600) -> None:
    """Saves a tree (dicts, lists, tuples) of NumPy arrays, scalars and jax.Arrays as one Orbax
    PyTree item in the new directory `path` (its parents are created), atomically.

    A jax.Array keeps its own sharding and each of its distinct blocks is written once, from its
    replica 0. A NumPy leaf is saved with its entry in `shardings` (a tree or a {path: sharding}
    dict of tessel or JAX NamedShardings, or PartitionSpecs on `mesh`), else replicated on
    `mesh`. `logical_axes` (a tree or {path: names}) and `rules` are recorded so that a restore
    onto another mesh resolves them again. Layout: OCDBT + zarr v2 (Orbax's default), zarr3 with
    `use_zarr3`, plain files with `use_ocdbt=False`; `compression` is "none", "zstd" or "zstd:L".

    In a multi-process JAX job every process calls save with the same path and tree: each writes
    the distinct blocks whose replica 0 is on its devices (into its own OCDBT database,
    `ocdbt.process_N`, as Orbax does) and process 0 commits once all have finished. They meet
    through JAX's coordination service; a process that fails makes every process raise, one that
    does not arrive within `timeout_s` makes the others raise, and nothing is committed then.
    """
    path = os.fspath(path)
    job = Job.current()
    meeting = Meeting(job, timeout_s) if job is not None else None
    try:
        leaves, sequences = _flatten(tree)
        given = _flat_map(shardings, _is_sharding_leaf)
        axes = _flat_map(logical_axes, lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))
        for p in list(given) + list(axes):
            if p not in leaves:
                raise ArgumentError(f"'{p}' has a sharding or logical axes but is not a leaf of the tree")
        local = job.local_ids if job is not None else None
        records = [_leaf_record(p, leaf, given.get(p), mesh, axes.get(p), local) for p, leaf in leaves.items()]
        layout = "\n".join(f"{r['path']} {r['dtype']}{list(r['shape'])} {r['sharding']!r} {list(r['sharding'].mesh.device_ids)}"
                           for r in records)
        error = None
    except Exception as e:  # every process learns of it before any writes
        if meeting is None:
            raise
        error, records, layout = e, None, ""
    if meeting is not None:
        meeting.agree(error, f"preparing the save of '{path}'", layout)
    # Its parents are created, as Orbax does, once the path is known to be local.
    _tessel.save_leaves(path, records, compression, use_ocdbt, use_zarr3, max_chunk_bytes, rules, sorted(sequences),
                        meeting, sorted(job.local_ids) if job is not None else [])


def save_safetensors(path: str, tree: Any, *, shardings: Any = None, mesh: Mesh | None = None,
                     max_file_bytes: int = 0, metadata: Mapping[str, str] | None = None) -> None:
    """Saves a tree of NumPy arrays, scalars and jax.Arrays as safetensors in the new directory
    `path`, atomically: `model.safetensors`, or with `max_file_bytes` Hugging Face's
    `model-0000i-of-0000N.safetensors` files and `model.safetensors.index.json`. Tensor names are
    the paths with '.' between levels ({"model": {"embed": w}} -> "model.embed"); `metadata` is
    every file's `__metadata__` (transformers writes {"format": "pt"}). Shardings as in `save`:
    each distinct block is written once, straight to its place in the file."""
    path = os.fspath(path)
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 0:
        raise ArgumentError(f"max_file_bytes must be a non-negative int, not {max_file_bytes!r}")
    meta = dict(metadata or {})
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ArgumentError(f"metadata must map str to str; {k!r}: {v!r} does not")
    leaves, _ = _flatten(tree)
    given = _flat_map(shardings, _is_sharding_leaf)
    for p in given:
        if p not in leaves:
            raise ArgumentError(f"'{p}' has a sharding but is not a leaf of the tree")
    records = [_leaf_record(p, leaf, given.get(p), mesh, None) for p, leaf in leaves.items()]
    _tessel.save_safetensors_leaves(path, records, max_file_bytes, meta)


# ---------------------------------------------------------------------------------------------
# Restore


def restore(path: str, *, mesh: Mesh | None = None, shardings: Any = None, rules: LogicalRules | None = None,
            step: int | None = None, item: str | None = None, select: str | Sequence[str] | None = None,
            as_jax: bool = False, staging_mb: int = 256, axis_map: Mapping[str, str] | None = None,
            logical_axes: Any = None, rename: Mapping[str, str] | None = None, stats: dict | None = None) -> Any:
    """Restores a checkpoint item onto devices, each device's block read straight from disk.

    `path` is an item, an Orbax step directory (its only PyTree item, or `item`) or a directory of
    steps (`step`, else the latest). Each array's target sharding is, in order: its entry in
    `shardings` (a tree or {path: value} of NamedShardings, PartitionSpecs on `mesh`, or
    jax.ShapeDtypeStructs, whose dtype it is then cast to); else, with `mesh`, its entry in
    `logical_axes` (a tree or {path: names}, or MaxText's logical_shardings.json) through `rules`,
    its saved logical axes through `rules` (default: the saved rules), or its saved spec on `mesh`
    (axes renamed by `axis_map`); else its saved sharding, or for a leaf saved without one
    (Orbax's NumPy arrays and scalars) device 0. `select` keeps the arrays whose path matches a glob
    ("params.decoder.*"); `rename` moves subtrees ({"params.params": ""}). The C++ library does all
    of it in one call (tessel::TargetSpec).

    Returns the tree (dicts, and lists where Orbax recorded sequences) of ShardedArrays, or of
    jax.Arrays with `as_jax=True`. A dict given as `stats` receives what the restore read:
    bytes_read, chunks_read, target_bytes (of this process's device buffers) and seconds.

    In a multi-process JAX job every process calls restore with the same target (shardings on
    the job's global mesh, JAX's device ids): each reads the blocks of its own devices only and
    gets global jax.Arrays (`as_jax=True`), or ShardedArrays holding its own devices' shards.
    """
    given = _flat_map(shardings, _is_sharding_leaf)
    target, dtypes, jax_shardings = {}, {}, {}
    for p, value in given.items():
        sharding, jax_sharding, dtype = _as_sharding(value, mesh, f"shardings['{p}']")
        target[p] = sharding
        if jax_sharding is not None:
            jax_shardings[p] = jax_sharding
        if dtype is not None:
            dtypes[p] = _dtype_name(dtype, p)
    axes_file = None
    if isinstance(logical_axes, (str, os.PathLike)):
        axes_file, logical_axes = os.fspath(logical_axes), None
    axes = _flat_map(logical_axes, lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))
    patterns = [] if select is None else [select] if isinstance(select, str) else list(select)
    restored = _tessel.restore(
        os.fspath(path), step, item, mesh, rules, target, dtypes, axes, axes_file, dict(axis_map or {}), patterns,
        list((rename or {}).items()), "mesh" if mesh is not None else "as_saved_or_one_device", staging_mb << 20,
        **jax_device_ids(Job.current()))
    if stats is not None:
        stats.update(restored.stats)
    out = {}
    for a in restored.arrays:
        dtype = numpy_dtype(a.dtype)
        shards = []
        for b in a.blocks:
            index = tuple(slice(s, s + n) for s, n in zip(b.start, b.shape))
            shards.append(Shard(b.device, index, b.replica_id, b.data.view(dtype).reshape(b.shape)))
        array = ShardedArray(tuple(a.shape), dtype, a.sharding, tuple(shards))
        out[a.path] = array.to_jax(jax_shardings.get(a.saved_path)) if as_jax else array
    return _unflatten(out, restored.key_types)


def convert(src: str, dst: str, *, to: str | None = None, mesh: Mesh | None = None, rules: Any = None,
            dtype: Any = None, step: int | None = None, item: str | None = None,
            select: str | Sequence[str] | None = None, rename: Mapping[str, str] | None = None,
            map: str | None = None, map_vars: Mapping[str, Any] | None = None, max_file_bytes: int = 0,
            compression: str = "none", use_ocdbt: bool = True, use_zarr3: bool = False, memory_mb: int = 128) -> str:
    """`tessel ckpt convert` from Python (the same library function): an Orbax item or step as
    safetensors, or safetensors as an Orbax item (`to`: "orbax" or "safetensors", default the other
    format of `src`; "maxtext-params" for MaxText's parameter-only checkpoint), streaming one batch
    of tensors at a time. Tensors go through `mesh` (default one device; `rules`: LogicalRules or a
    rules file), cast to `dtype`; `select` keeps subtrees (globs), `rename` moves them
    ({"params.params": ""}); `map` is a key map (examples/maps/llama.yml) with `map_vars`
    ({"head_dim": 128}); through a map each stacked tensor is read and written a slab at a time.
    `memory_mb` bounds the host memory of the tensors (or pieces) in flight. Returns the format
    written."""
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1:
        raise ArgumentError(f"memory_mb must be a positive number of MiB, not {memory_mb!r}")
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int):
        raise ArgumentError(f"max_file_bytes must be a non-negative multiple of 1 MiB, not {max_file_bytes!r}")
    if rules is not None and not isinstance(rules, LogicalRules):
        from tessel._model import load_rules
        rules = load_rules(rules)
    patterns = [] if select is None else [select] if isinstance(select, str) else list(select)
    return _tessel.convert(
        os.fspath(src), os.fspath(dst), step, item, to, mesh, rules,
        None if dtype is None else dtype if isinstance(dtype, str) else np.dtype(dtype).name, patterns,
        list((rename or {}).items()), None if map is None else os.fspath(map),
        {str(k): str(v) for k, v in (map_vars or {}).items()}, max_file_bytes, compression, use_ocdbt, use_zarr3,
        memory_mb << 20)


# ---------------------------------------------------------------------------------------------
# Inspection


def steps(root: str) -> list[int]:
    """The committed steps of a directory of steps, ascending."""
    return list(_tessel.list_steps(os.fspath(root)))


def items(step_dir: str) -> list[dict]:
    """The items of an Orbax step directory: name, handler and whether it holds arrays."""
    return [{"name": i.name, "handler": i.handler, "holds_arrays": i.holds_arrays}
            for i in _tessel.list_items(os.fspath(step_dir))]


_ARRAY_FIELDS = ("path", "name", "dtype", "shape", "chunk_shape", "num_chunks", "stored_bytes", "compression",
                 "saved_sharding", "logical_axes")


def info(path: str, *, step: int | None = None, item: str | None = None) -> dict:
    """What `tessel ckpt info --json` shows: the item, its storage and, per array, its dtype,
    shape, chunks, stored bytes, codec, saved sharding and logical axes."""
    opened = _tessel.open_item(os.fspath(path), step, item)
    arrays = [{k: tuple(v) if isinstance(v, list) else v for k, v in ((f, getattr(a, f)) for f in _ARRAY_FIELDS)}
              for a in opened.arrays()]
    out = {"item": opened.dir, "storage": opened.storage, "rules": opened.rules, "arrays": arrays}
    if opened.format == "safetensors":
        out["metadata"] = dict(opened.metadata)
    return out


def verify(path: str, *, step: int | None = None, item: str | None = None) -> dict:
    """Reads every chunk and checks sizes, decoding and CRC-32C. Returns the report; its
    "faults" list names each bad chunk (empty when the item is sound). "unchecked" counts the
    chunks with no checksum to compare (Orbax writes none): read and decoded, but a flipped byte
    in them goes unnoticed."""
    opened = _tessel.open_item(os.fspath(path), step, item)
    r = opened.verify()
    return {"faults": list(r.faults), "arrays": r.arrays, "chunks": r.chunks, "bytes": r.bytes,
            "checksums": r.checksums, "unchecked": r.unchecked, "item": opened.dir}
