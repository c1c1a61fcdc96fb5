"""The abstract state of any Flax NNX module, placed on a mesh by tessel's rules."""
from __future__ import annotations

from typing import Any, Sequence

from tessel._jax import to_jax
from tessel._tessel import ArgumentError, LogicalRules, Mesh, PartitionSpec


def nnx_abstract_state(model: Any, mesh: Mesh, rules: LogicalRules, *, remove_size_one_axes: bool = False,
                       devices: Sequence[Any] | None = None) -> Any:
    """The abstract state of a Flax NNX module: ``nnx.state(model)``'s structure, each variable's
    value a ``jax.ShapeDtypeStruct`` with its ``NamedSharding`` on ``mesh`` (a tessel Mesh; JAX's
    devices by id, or ``devices``). A variable's sharding comes from its logical axis names
    (``nnx.with_partitioning``, ``nnx.vmap``'s ``transform_metadata``) through ``rules`` as Flax
    Linen's ``logical_to_mesh_axes`` resolves them (MaxText's resolution, ``remove_size_one_axes``
    as its option); a variable without names is a full copy on every device. Nothing is allocated.

    ``model`` is a module (concrete or from ``nnx.eval_shape``), its ``nnx.State``, or a function
    of no arguments that builds it (run under ``nnx.eval_shape`` with Flax's eager sharding off).
    The result is Orbax's restore target as it is, and ``nnx.merge(graphdef, restored)`` gives the
    module back."""
    import jax
    from flax import nnx

    if not isinstance(mesh, Mesh):
        raise ArgumentError(f"mesh must be a tessel Mesh, not {type(mesh).__name__}")
    if not isinstance(rules, LogicalRules):
        raise ArgumentError(f"rules must be tessel LogicalRules (tessel.load_rules), not {type(rules).__name__}")
    if not isinstance(model, (nnx.Module, nnx.State)):
        if not callable(model):
            raise ArgumentError(f"model must be an NNX module, its state or a function building it, not "
                                f"{type(model).__name__}")
        with nnx.use_eager_sharding(False):
            model = nnx.eval_shape(model)
    state = model if isinstance(model, nnx.State) else nnx.state(model)
    names = nnx.get_partition_spec(state)
    jax_mesh = to_jax(mesh, devices)
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731

    def place(path, variable, logical):
        value = variable.get_value()
        axes = tuple(logical.get_value()) if isinstance(logical, nnx.Variable) else ()
        where = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        if axes and len(axes) != len(value.shape):
            raise ArgumentError(f"'{where}': {len(axes)} logical axis names {axes} for a value of shape {value.shape}")
        spec = rules.resolve(list(axes), mesh, shape=list(value.shape), remove_size_one_axes=remove_size_one_axes,
                             name=where) if axes else PartitionSpec()
        sharding = jax.sharding.NamedSharding(jax_mesh, to_jax(spec))
        return variable.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))

    return jax.tree_util.tree_map_with_path(place, state, names, is_leaf=is_variable)
