"""Conversions between tessel's and JAX's Mesh, PartitionSpec and NamedSharding (JAX optional)."""
from __future__ import annotations

from typing import Any, Sequence

from tessel._tessel import ArgumentError, Mesh, NamedSharding, PartitionSpec


def _jax():
    try:
        import jax
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("tessel.to_jax/from_jax need JAX: pip install 'tessel[jax]'") from e
    return jax


def from_jax(obj: Any) -> Mesh | PartitionSpec | NamedSharding:
    """The tessel equivalent of a jax.sharding Mesh, PartitionSpec, NamedSharding or
    SingleDeviceSharding. Device ids are JAX's ``device.id``."""
    jax = _jax()
    js = jax.sharding
    if isinstance(obj, js.NamedSharding):
        return NamedSharding(from_jax(obj.mesh), from_jax(obj.spec))
    if isinstance(obj, js.SingleDeviceSharding):
        (device,) = obj.device_set
        return NamedSharding(Mesh([("device", 1)], [device.id]), PartitionSpec())
    if isinstance(obj, js.Mesh):
        return Mesh(list(zip(obj.axis_names, obj.devices.shape)), [d.id for d in obj.devices.flat])
    if isinstance(obj, js.PartitionSpec):
        for entry in obj:
            if entry is js.PartitionSpec.UNCONSTRAINED:
                raise ArgumentError(f"{obj}: UNCONSTRAINED is a hint to jit's partitioner, not a placement; "
                                    "tessel needs each dimension's mesh axes")
        if getattr(obj, "unreduced", None) or getattr(obj, "reduced", None):
            raise ArgumentError(f"{obj}: unreduced/reduced axes have no tessel equivalent")
        return PartitionSpec(*obj)
    raise ArgumentError(f"from_jax: {type(obj).__name__} is not a jax.sharding Mesh, PartitionSpec, "
                        "NamedSharding or SingleDeviceSharding")


def to_jax(obj: Mesh | PartitionSpec | NamedSharding, devices: Sequence[Any] | None = None) -> Any:
    """The jax.sharding equivalent of a tessel Mesh, PartitionSpec or NamedSharding; a mesh's
    device ids are looked up among ``devices`` (default: ``jax.devices()``) by ``device.id``."""
    jax = _jax()
    js = jax.sharding
    if isinstance(obj, PartitionSpec):
        return js.PartitionSpec(*obj)
    if isinstance(obj, NamedSharding):
        return js.NamedSharding(to_jax(obj.mesh, devices), js.PartitionSpec(*obj.spec))
    if isinstance(obj, Mesh):
        import numpy as np

        by_id = {d.id: d for d in (devices if devices is not None else jax.devices())}
        missing = [i for i in obj.device_ids if i not in by_id]
        if missing:
            raise ArgumentError(f"{obj!r} uses device ids {missing[:8]} that JAX does not have "
                                f"(it has {sorted(by_id)[:16]})")
        grid = np.empty(len(obj.device_ids), dtype=object)
        for i, d in enumerate(obj.device_ids):
            grid[i] = by_id[d]
        return js.Mesh(grid.reshape(tuple(obj.shape.values())), obj.axis_names)
    raise ArgumentError(f"to_jax: {type(obj).__name__} is not a tessel Mesh, PartitionSpec or NamedSharding")
