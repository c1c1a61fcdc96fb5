"""tessel: GSPMD-style sharding of model state.

Meshes, PartitionSpecs and NamedShardings with JAX's semantics; logical axis rules resolved as
Flax Linen's ``logical_to_mesh_axes`` with MaxText's options; a model's abstract state and memory
plan on any mesh (``eval_shape``, ``plan``); Orbax checkpoints saved and restored onto any mesh,
each device's block read straight from disk (``tessel.checkpoint``).

    >>> import tessel
    >>> mesh = tessel.Mesh({"data": 2, "fsdp": 4})
    >>> rules = tessel.LogicalRules([("embed", "fsdp"), ("mlp", "tensor")])
    >>> rules.resolve(("embed", "mlp"), tessel.Mesh({"fsdp": 4, "tensor": 2}))
    PartitionSpec('fsdp', 'tensor')
"""
from tessel._tessel import (
    ArgumentError,
    Error,
    IoError,
    LogicalRules,
    MemoryPlan,
    Mesh,
    ModelConfig,
    NamedSharding,
    OutOfMemoryError,
    ParseError,
    PartitionSpec,
    ShardingError,
)
from tessel._jax import from_jax, to_jax
from tessel._model import AbstractArray, eval_shape, forward, load_maxtext_model, load_model, load_rules, plan
from tessel._nnx import nnx_abstract_state
from tessel import checkpoint

P = PartitionSpec
__version__ = "0.1.0"

__all__ = [
    "AbstractArray",
    "ArgumentError",
    "Error",
    "IoError",
    "LogicalRules",
    "Mesh",
    "NamedSharding",
    "OutOfMemoryError",
    "P",
    "ParseError",
    "PartitionSpec",
    "ShardingError",
    "checkpoint",
    "eval_shape",
    "forward",
    "from_jax",
    "load_maxtext_model",
    "load_model",
    "load_rules",
    "nnx_abstract_state",
    "plan",
    "to_jax",
]
