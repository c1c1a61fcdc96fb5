"""Model configs, abstract state and memory plans: `load_model`, `eval_shape`, `plan`.

Nothing here allocates a parameter, so the mesh may be far larger than this machine (plan a
4096-device job on a laptop).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from tessel import _tessel
from tessel._path import is_url, local_path
from tessel._tessel import ArgumentError, LogicalRules, MemoryPlan, Mesh, ModelConfig, NamedSharding


@dataclass(frozen=True)
class AbstractArray:
    """One variable of an abstract state: what `jax.eval_shape` gives, plus where it lives.

    Usable as it is as a `tessel.checkpoint.restore` target (its sharding and dtype), and as
    Orbax's after `to_jax()`.
    """
    shape: tuple[int, ...]
    dtype: np.dtype
    sharding: NamedSharding
    logical_axes: Any  # a tuple of logical names (str or None) per dimension, a PartitionSpec or None
    kind: str = "param"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def to_jax(self):
        """A jax.ShapeDtypeStruct with the jax.sharding.NamedSharding of this sharding."""
        import jax
        from tessel._jax import to_jax
        return jax.ShapeDtypeStruct(self.shape, self.dtype, sharding=to_jax(self.sharding))


def load_model(model: str | os.PathLike | Mapping[str, Any] | ModelConfig) -> ModelConfig:
    """A model config from a YAML file, YAML text or a dict (`{"model": "transformer", "vocab": ...}`).

    The keys are those of `examples/models/*.yml`; unknown keys and bad sizes raise
    `tessel.ParseError` naming the key.
    """
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, Mapping):
        return _tessel.parse_model(json.dumps(dict(model)))  # JSON is YAML's flow style
    if isinstance(model, os.PathLike) or is_url(model):
        return _tessel.load_model_file(local_path(model, "model"))
    if isinstance(model, str):
        is_text = "\n" in model or ":" in model or model.lstrip().startswith("{")
        return _tessel.parse_model(model) if is_text else _tessel.load_model_file(model)
    raise ArgumentError(f"model: {model!r} is not a path, YAML text, a dict or a ModelConfig")


def load_maxtext_model(model: str | os.PathLike, base: str | os.PathLike, *, set: Mapping[str, Any] | Sequence[str] = (),
                       rules: str | os.PathLike | None = None) -> ModelConfig:
    """One of MaxText's models from MaxText's files: the model file (configs/models/<name>.yml) over
    base.yml, then `set` overrides ({"scan_layers": False} or ["scan_layers=false"]); `rules` a
    custom mesh-and-rule file. Its `.rules` are the config's and `.maxtext_mesh(n)` the mesh
    MaxText builds for n devices; eval_shape and plan take it without rules.

        m = tessel.load_maxtext_model("models/qwen3-0.6b.yml", "base.yml", set={"scan_layers": False})
        state = tessel.eval_shape(m, m.maxtext_mesh(16))
    """
    if isinstance(set, Mapping):
        sets = [f"{k}={json.dumps(v)}" for k, v in set.items()]  # JSON values are YAML
    else:
        sets = [str(s) for s in set]
    return _tessel.load_maxtext_model(local_path(model, "model"), local_path(base, "base"), sets,
                                      None if rules is None else local_path(rules, "rules"))


def _rules_for(model: ModelConfig, rules) -> LogicalRules:
    if rules is None:
        if model.rules is None:
            raise ArgumentError(f"rules: {model.family} needs logical axis rules (only MaxText models carry their own)")
        return model.rules
    return load_rules(rules)


def load_rules(rules: LogicalRules | Sequence | str | os.PathLike) -> LogicalRules:
    """Logical axis rules from a MaxText YAML/JSON file (logical_axis_rules, mesh_axes), such text,
    or a Flax-style list of (logical name, mesh axes) pairs."""
    if isinstance(rules, LogicalRules):
        return rules
    if isinstance(rules, os.PathLike) or is_url(rules):
        return _tessel.load_rules(local_path(rules, "rules"))
    if isinstance(rules, str):
        return _tessel.load_rules(rules)
    if isinstance(rules, (list, tuple)):
        return LogicalRules(list(rules))
    raise ArgumentError(f"rules: {rules!r} is not a path, YAML text, a list of (name, axes) pairs or LogicalRules")


def eval_shape(model, mesh: Mesh, rules=None, *, remove_size_one_axes: bool = False, drop_indivisible: bool = False,
               strict: bool = False, as_jax: bool = False, flat: bool = False) -> dict:
    """The model's abstract state on `mesh`: every parameter's shape, dtype and sharding under `rules`.

    `model`: what `load_model` takes; `rules`: LogicalRules, Flax-style (name, axes) pairs or a
    rules file (None: a MaxText model's own). Returns nested dicts keyed by path segment (`{"decoder": {"layers": ...}}`), or
    `{"decoder/layers/...": ...}` with `flat=True`, of AbstractArrays, or of
    jax.ShapeDtypeStructs carrying jax NamedShardings with `as_jax=True` (Orbax's restore target).
    """
    from tessel.checkpoint import _unflatten, numpy_dtype
    model = load_model(model)
    records = _tessel.eval_shape_records(model, mesh, _rules_for(model, rules), remove_size_one_axes,
                                         drop_indivisible, strict)
    out = {}
    for path, kind, shape, dtype, sharding, logical in records:
        leaf = AbstractArray(tuple(shape), numpy_dtype(dtype), sharding, logical, kind)
        out[path] = leaf.to_jax() if as_jax else leaf
    return out if flat else _unflatten(out, {})


def plan(model, mesh: Mesh, rules=None, *, optimizer: str = "none", gradients: bool = False,
         replica_axes: Sequence[str] = ("data", "diloco"), tolerance: float = 0.02, top: int = 10,
         remove_size_one_axes: bool = False, drop_indivisible: bool = False, strict: bool = False) -> MemoryPlan:
    """The memory plan `tessel plan` prints: bytes per device for parameters, gradients and
    optimizer state ("none", "sgd" or "adamw"), the largest replicated parameters, and MaxText's
    sufficiently-sharded check (mesh axes other than `replica_axes` should shard every parameter,
    up to `tolerance` of the bytes)."""
    if isinstance(replica_axes, str):
        replica_axes = [a for a in replica_axes.split(",") if a]
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ArgumentError(f"plan: top must be a non-negative int, not {top!r}")
    model = load_model(model)
    return _tessel.plan(model, mesh, _rules_for(model, rules), remove_size_one_axes, drop_indivisible, strict,
                        optimizer, gradients, list(replica_axes), float(tolerance), top)


def forward(model, weights: Mapping[str, Any], inputs, mesh: Mesh, rules=None) -> np.ndarray:
    """The model's forward pass on `mesh` with these weights: logits [batch, seq, vocab] (float32)
    from int32 tokens [batch, seq] for the language models, DotReluDot's output from its input.

    `weights`: every parameter of the model, as nested dicts or {"decoder/layers/mlp/wo/kernel":
    array} (NumPy arrays, jax.Arrays, or the ShardedArrays `tessel.checkpoint.restore` gives), in
    the model's shapes and dtypes. Each of the mesh's devices (host devices here) gets its block of
    every parameter under `rules` (None: a MaxText model's own) and its rows of the batch.

        m = tessel.load_maxtext_model("models/qwen3-0.6b.yml", "base.yml", set={"base_num_decoder_layers": 2})
        params = tessel.checkpoint.restore("ckpt/0/items", mesh=mesh)["params"]["params"]
        logits = tessel.forward(m, params, tokens, mesh)
    """
    from tessel.checkpoint import _dtype_name, _flatten, _is_leaf, numpy_dtype
    model = load_model(model)
    if isinstance(weights, Mapping) and weights and all(_is_leaf(v) for v in weights.values()):
        flat = {str(k): v for k, v in weights.items()}
    else:
        flat = _flatten(weights)[0]

    def record(value, where):
        a = np.ascontiguousarray(np.asarray(value))
        return _dtype_name(a.dtype, where), list(a.shape), a.reshape(-1).view(np.uint8)

    records = [(path, *record(v, path)) for path, v in flat.items()]
    dtype, shape, data = _tessel.forward(model, mesh, _rules_for(model, rules), records, *record(inputs, "inputs"))
    return np.frombuffer(data, numpy_dtype(dtype)).reshape(shape)
