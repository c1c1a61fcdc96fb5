"""Random trees of arrays for the checkpoint cross-checks, and bit-exact comparison."""
import numpy as np

import jax
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxSharding
from jax.sharding import PartitionSpec as JP

# Every dtype both tessel and Orbax store; bfloat16 is ml_dtypes' (JAX's).
DTYPES = ["float32", "bfloat16", "float16", "float64", "int8", "int32", "int64", "uint8", "uint32", "bool"]
AXES = ["data", "fsdp", "tensor", "x"]


def np_dtype(name):
    return np.dtype(jax.numpy.bfloat16) if name == "bfloat16" else np.dtype(name)


def random_array(r, shape, dtype_name):
    """Random values covering each dtype's range (floats include negatives, large and tiny values)."""
    g = np.random.default_rng(r.randrange(2**32))
    dtype = np_dtype(dtype_name)
    if dtype_name == "bool":
        return g.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return g.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    values = g.standard_normal(shape) * 10.0 ** g.integers(-3, 4, shape)
    return values.astype(dtype)


def bits(a):
    """An array's bytes, for bit-exact comparison (NaN payloads and -0.0 included)."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.shape, a.dtype.str if a.dtype.kind != "V" else a.dtype.name, a.tobytes()


def assert_bit_identical(got, want, where):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (where, got.shape, want.shape)
    assert got.dtype == want.dtype, (where, got.dtype, want.dtype)
    assert got.tobytes() == want.tobytes(), f"{where}: values differ"


def random_jax_mesh(r, devices, n=8):
    """A JAX mesh over n devices in a random order, with 1-3 axes whose sizes multiply to n."""
    while True:
        axes = r.sample(AXES, r.randint(1, 3))
        sizes = [r.choice([1, 2, 4, 8]) for _ in axes]
        if int(np.prod(sizes)) == n:
            break
    chosen = r.sample(devices, n)
    return JaxMesh(np.array(chosen, dtype=object).reshape(sizes), axes)


def random_spec(r, mesh, shape):
    """A spec whose sharded dimensions divide the shape (JAX's rule)."""
    free = list(mesh.axis_names)
    r.shuffle(free)
    spec = []
    for n in shape:
        if not free or r.random() < 0.35:
            spec.append(None)
            continue
        axes = []
        ways = 1
        for _ in range(r.randint(1, 2)):
            if free and n % (ways * mesh.shape[free[-1]]) == 0:
                ways *= mesh.shape[free[-1]]
                axes.append(free.pop())
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return JP(*spec)


def random_shape(r, empty=True):
    kind = r.random()
    if kind < 0.12:
        return ()
    if kind < 0.2 and empty:
        return tuple(r.choice([0, 4]) for _ in range(r.randint(1, 2))) + (0,)
    return tuple(r.choice([1, 2, 4, 6, 8, 16, 24]) for _ in range(r.randint(1, 3)))


def random_tree(r, depth=0, empty=True):
    """Nested dicts and lists of (shape, dtype) leaf descriptions; `empty`: 0-sized arrays too."""
    if depth >= 2 or r.random() < 0.3:
        return (random_shape(r, empty), r.choice(DTYPES))
    if r.random() < 0.3:
        return [random_tree(r, depth + 1, empty) for _ in range(r.randint(1, 3))]
    return {f"k{i}": random_tree(r, depth + 1, empty) for i in range(r.randint(1, 3))}


def map_tree(fn, tree, path=""):
    if isinstance(tree, dict):
        return {k: map_tree(fn, v, f"{path}/{k}" if path else k) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_tree(fn, v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(tree)]
    return fn(path, tree)


def leaves(tree, path=""):
    out = {}
    map_tree(lambda p, x: out.__setitem__(p, x), tree, path)
    return out


def sharding(r, mesh, shape):
    return JaxSharding(mesh, random_spec(r, mesh, shape))
