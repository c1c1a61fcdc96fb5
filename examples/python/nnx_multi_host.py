"""docs/nnx.md's workflow in a multi-process JAX job, with a model of one's own: every process runs
this same script (one per host; here all on one machine).

    python examples/python/nnx_multi_host.py PROCESS_ID NUM_PROCESSES HOST:PORT CHECKPOINT_DIR

Each process: places its own NNX module on the job's global mesh by tessel's rules, creates it
sharded (each device computes only its shards), saves it with tessel (each process writes the
blocks whose replica 0 it holds; process 0 commits), and restores it onto another global mesh, each
process reading only its own devices' blocks, as Orbax's restore target and tessel's alike. It
prints one JSON line per process: what it read and that the restored model computes the same.
"""
import json
import os
import sys

import jax

process_id, processes, coordinator, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id)

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import tessel  # noqa: E402

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rules = tessel.load_rules(os.path.join(EXAMPLES, "models", "rules.yml"))


class Encoder(nnx.Module):
    """One's own module: an embedding and vmap-stacked layers (nnx.LinearGeneral 3-D kernels and
    an MLP), every weight named by its logical axes; norms unnamed."""

    def __init__(self, rngs, vocab=64, embed=64, heads=4, head_dim=16, mlp=128, depth=2):
        init = nnx.initializers.lecun_normal()
        self.embed = nnx.Embed(vocab, embed, rngs=rngs,
                               embedding_init=nnx.with_partitioning(nnx.initializers.normal(), ("vocab", "embed")))

        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def layers(rngs):
            return Layer(embed, heads, head_dim, mlp, init, rngs)

        self.layers = layers(rngs)
        self.norm = nnx.RMSNorm(embed, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def forward(layer, x):
            return layer(x)

        return self.norm(forward(self.layers, x))


class Layer(nnx.Module):
    def __init__(self, embed, heads, head_dim, mlp, init, rngs):
        self.qkv = nnx.LinearGeneral(embed, (heads, head_dim), use_bias=False, rngs=rngs,
                                     kernel_init=nnx.with_partitioning(init, ("embed", "heads", "kv")))
        self.out = nnx.LinearGeneral((heads, head_dim), embed, axis=(-2, -1), use_bias=False, rngs=rngs,
                                     kernel_init=nnx.with_partitioning(init, ("heads", "kv", "embed")))
        self.wi = nnx.Linear(embed, mlp, use_bias=False, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("embed", "mlp")))
        self.wo = nnx.Linear(mlp, embed, use_bias=False, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))

    def __call__(self, x):
        x = x + self.out(jax.nn.gelu(self.qkv(x)))
        return x + self.wo(jax.nn.relu(self.wi(x)))


def global_mesh(shape, order):
    """A tessel Mesh over the job's devices (JAX's ids) in `order`, axes as the rules name them."""
    devices = sorted(jax.devices(), key=lambda d: d.id)
    return tessel.Mesh({"data": shape[0], "fsdp": shape[1], "tensor": shape[2]}, [devices[i].id for i in order])


n = jax.device_count()
build = lambda: Encoder(nnx.Rngs(0))  # noqa: E731

# 1. The abstract state on the job's global mesh: ShapeDtypeStructs with their NamedShardings.
save_mesh = global_mesh((1, n // 2, 2), range(n))
abstract = tessel.nnx_abstract_state(build, save_mesh, rules)

# 2. The model created sharded: each device computes its own shards only (the shardings are
# tessel's, so Flax's eager sharding, which wants a mesh context, stays off).
shardings = jax.tree.map(lambda v: v.sharding, abstract)
with nnx.use_eager_sharding(False):
    graphdef = nnx.graphdef(nnx.eval_shape(build))
    model = nnx.merge(graphdef, jax.jit(lambda: nnx.state(build()), out_shardings=shardings)())


def tokens(mesh):  # the same batch on every process, replicated on the mesh
    return jax.make_array_from_callback((4, 8), jax.sharding.NamedSharding(tessel.to_jax(mesh), jax.P()),
                                        lambda index: (np.arange(32, dtype=np.int32).reshape(4, 8) * 7 % 64)[index])


before = float(jax.jit(lambda m, t: m(t).sum())(model, tokens(save_mesh)))

# 3. Saved by every process: each writes the blocks whose replica 0 it holds.
params = nnx.state(model, nnx.Param)
tessel.checkpoint.save(os.path.join(ckpt_dir, "1"), nnx.to_pure_dict(params))

# 4. Restored onto another global mesh (devices in reverse order, not process order): each
# process reads only its devices' blocks.
load_mesh = global_mesh((1, n // 2, 2), reversed(range(n)))
target = tessel.nnx_abstract_state(build, load_mesh, rules).filter(nnx.Param)
stats = {}
restored = tessel.checkpoint.restore(os.path.join(ckpt_dir, "1"), shardings=nnx.to_pure_dict(target), as_jax=True,
                                     stats=stats)
nnx.replace_by_pure_dict(target, restored)
loaded = nnx.merge(graphdef, target, nnx.state(model, nnx.Not(nnx.Param)))
after = float(jax.jit(lambda m, t: m(t).sum())(loaded, tokens(load_mesh)))

# 5. The same values as saved, and Orbax restores the same checkpoint into the same target.
whole = lambda tree: [np.asarray(multihost_utils.process_allgather(a, tiled=True)) for a in jax.tree.leaves(tree)]  # noqa: E731
with ocp.StandardCheckpointer() as checkpointer:
    by_orbax = checkpointer.restore(os.path.join(ckpt_dir, "1"), nnx.to_pure_dict(
        tessel.nnx_abstract_state(build, load_mesh, rules).filter(nnx.Param)))
saved, ours, orbax = whole(nnx.to_pure_dict(params)), whole(restored), whole(by_orbax)
equal = all(a.tobytes() == b.tobytes() == c.tobytes() for a, b, c in zip(saved, ours, orbax))

# This process's shards: each distinct block once.
blocks = {(i, str(s.index)): s.data.nbytes for i, a in enumerate(jax.tree.leaves(restored)) for s in a.addressable_shards}
print(json.dumps({"process": process_id, "loss_before": before, "loss_after": after, "equal_bit_for_bit": equal,
                  "bytes_read": stats["bytes_read"], "shard_bytes": sum(blocks.values()),
                  "total_bytes": sum(a.nbytes for a in jax.tree.leaves(restored))}), flush=True)
