"""The Flax NNX GSPMD guide's workflow with tessel in it, on 8 host CPU devices.

The guide: annotate each parameter with logical axis names (nnx.with_partitioning), map them to
mesh axes with rules, create the model sharded under jit, shard the inputs, train, and load a
sharded model from a checkpoint. tessel plays two parts: its plan and abstract state are the
shardings, shapes and dtypes of the same model under the same rules file (Flax Linen's and
MaxText's resolution), and its abstract state is Orbax's restore target, so a checkpoint lands on
each device as its shard (flax#5110: nnx.eval_shape's abstract state had no shardings, and Orbax
restored the whole model onto one device).

    .venv/bin/python examples/python/nnx_gspmd.py [--model dot_relu_dot|transformer] [--steps 3]

The models here have tessel's parameter trees (examples/models/*.yml): DotReluDot (dot1/kernel,
w2) and tessel's transformer (token_embedder/embedding, decoder/layers/... stacked on axis 1,
decoder/decoder_norm/scale, decoder/logits_dense/kernel), so tessel's checkpoints load into them.
"""
import argparse
import os
import resource
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import yaml  # noqa: E402
from flax import nnx  # noqa: E402

import tessel  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RULES = os.path.join(EXAMPLES, "models", "rules.yml")


def param(rngs, init, shape, names):
    """A parameter annotated with its logical axis names, as the guide writes them."""
    return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape))


# -- The guide's model -----------------------------------------------------------------------------

class DotReluDot(nnx.Module):
    def __init__(self, depth, hidden, rngs):
        init = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(depth, hidden, use_bias=False, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                               rngs=rngs)
        self.w2 = param(rngs, init, (hidden, depth), ("mlp", "embed"))

    def __call__(self, x):
        return jax.nn.relu(self.dot1(x)) @ self.w2[...]

    def loss(self, x, y):  # the regression task `tessel train` gives DotReluDot
        return jnp.mean((self(x) - y) ** 2)


# -- tessel's transformer as NNX modules -------------------------------------------------------------

class Kernel(nnx.Module):
    def __init__(self, rngs, shape, names):
        self.kernel = param(rngs, nnx.initializers.lecun_normal(), shape, names)


class Scale(nnx.Module):
    def __init__(self, rngs, shape, names):
        self.scale = param(rngs, nnx.initializers.ones, shape, names)


class Attention(nnx.Module):
    def __init__(self, rngs, c):
        e, n, h, kv, d = c["embed"], c["layers"], c["heads"], c["kv_heads"], c["embed"] // c["heads"]
        self.query = Kernel(rngs, (e, n, h, d), ("embed", "layers", "q_heads", "kv"))
        self.key = Kernel(rngs, (e, n, kv, d), ("embed", "layers", "kv_heads", "kv"))
        self.value = Kernel(rngs, (e, n, kv, d), ("embed", "layers", "kv_heads", "kv"))
        self.out = Kernel(rngs, (h, n, d, e), ("heads", "layers", "kv", "embed"))


class Mlp(nnx.Module):
    def __init__(self, rngs, c):
        e, n, m = c["embed"], c["layers"], c["mlp"]
        self.wi = Kernel(rngs, (e, n, m), ("embed", "layers", "mlp"))
        self.wo = Kernel(rngs, (m, n, e), ("mlp", "layers", "embed"))


class Layers(nnx.Module):
    """Every layer's parameters stacked on axis 1 (a norm's layer axis is its last), as MaxText scans them."""

    def __init__(self, rngs, c):
        e, n = c["embed"], c["layers"]
        self.pre_self_attention_layer_norm = Scale(rngs, (e, n), ("norm", "layers"))
        self.self_attention = Attention(rngs, c)
        self.post_self_attention_layer_norm = Scale(rngs, (e, n), ("norm", "layers"))
        self.mlp = Mlp(rngs, c)


class Decoder(nnx.Module):
    def __init__(self, rngs, c):
        self.layers = Layers(rngs, c)
        self.decoder_norm = Scale(rngs, (c["embed"],), ("norm",))
        self.logits_dense = Kernel(rngs, (c["embed"], c["vocab"]), ("embed", "vocab"))


class Embedder(nnx.Module):
    def __init__(self, rngs, c):
        self.embedding = param(rngs, nnx.initializers.normal(1.0), (c["vocab"], c["embed"]), ("vocab", "embed"))


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * scale


def rotate(x):
    """Rotary positions on [batch, seq, heads, head_dim], halves paired, timescale 10000 (MaxText's)."""
    half = x.shape[-1] // 2
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] / 10000.0 ** (
        jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    return jnp.concatenate([x[..., :half] * cos - x[..., half:] * sin, x[..., half:] * cos + x[..., :half] * sin], -1)


class Transformer(nnx.Module):
    """tessel's `model: transformer` (gelu MLP, untied logits) with its parameter tree."""

    def __init__(self, config, rngs):
        self.config = dict(config, kv_heads=config.get("kv_heads") or config["heads"])
        self.token_embedder = Embedder(rngs, self.config)
        self.decoder = Decoder(rngs, self.config)

    def __call__(self, tokens):
        c = self.config
        h, kv = c["heads"], c["kv_heads"]
        x = self.token_embedder.embedding[...][tokens]
        b, s, e = x.shape
        d = e // h
        layers = self.decoder.layers
        for i in range(c["layers"]):
            at = lambda p: jnp.take(p[...], i, axis=1)  # noqa: E731  (this layer's slice)
            y = rms_norm(x, at(layers.pre_self_attention_layer_norm.scale))
            a = layers.self_attention
            q = jnp.einsum("bse,ehd->bshd", y, at(a.query.kernel))
            k = jnp.einsum("bse,ehd->bshd", y, at(a.key.kernel))
            v = jnp.einsum("bse,ehd->bshd", y, at(a.value.kernel))
            q, k = rotate(q) / np.sqrt(d), rotate(k)
            k, v = jnp.repeat(k, h // kv, axis=2), jnp.repeat(v, h // kv, axis=2)  # grouped-query
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
            scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -0.7 * jnp.finfo(jnp.float32).max)
            context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
            x = x + jnp.einsum("bshd,hde->bse", context, at(a.out.kernel))
            y = rms_norm(x, at(layers.post_self_attention_layer_norm.scale))
            x = x + jax.nn.gelu(y @ at(layers.mlp.wi.kernel), approximate=True) @ at(layers.mlp.wo.kernel)
        return rms_norm(x, self.decoder.decoder_norm.scale[...]) @ self.decoder.logits_dense.kernel[...]

    def loss(self, tokens, targets):
        logp = jax.nn.log_softmax(self(tokens), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


# -- The workflow ------------------------------------------------------------------------------------

def jax_mesh(tessel_mesh):
    """tessel's mesh as a JAX mesh over the same devices (device ids are JAX's)."""
    return tessel.to_jax(tessel_mesh)


def model_config(name):
    """tessel's YAML for the model, and the NNX module that has its tree."""
    path = os.path.join(EXAMPLES, "models", f"{name}.yml")
    config = yaml.safe_load(open(path))
    return path, config


def build(config, rngs):
    if config["model"] == "dot_relu_dot":
        return DotReluDot(config["depth"], config.get("hidden") or config["depth"], rngs)
    return Transformer(config, rngs)


def create_sharded(config, mesh, rules, seed=0):
    """The guide's sharded creation: inside jit, each variable constrained to its PartitionSpec under
    the logical rules, so each device only ever computes and holds its shard."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules.rules):
        @nnx.jit
        def create():
            model = build(config, nnx.Rngs(seed))
            state = nnx.state(model)
            nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
            return model
        return create()


def flat(state):
    """{"decoder/layers/...": value} of an NNX state (of arrays, specs or abstract values)."""
    return {"/".join(str(k) for k in path): v.get_value() if isinstance(v, nnx.Variable) else v
            for path, v in nnx.to_flat_state(state)}


def nnx_specs(tree, rules):
    """{path: PartitionSpec} that Flax NNX gives each variable of `tree` (a module or optimizer)."""
    with nnx.logical_axis_rules(rules.rules):
        return flat(nnx.get_partition_spec(nnx.state(tree)))


def tessel_specs(model_yaml, tessel_mesh, rules):
    """{path: PartitionSpec} of tessel's abstract state for the same model, as JAX spells specs."""
    state = tessel.eval_shape(model_yaml, tessel_mesh, rules, flat=True)
    return {path: jax.sharding.PartitionSpec(*a.sharding.spec) for path, a in state.items()}


def per_device_bytes(tree):
    """Bytes each device holds of the arrays in `tree` (their addressable shards)."""
    out = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def abstract_model(config, mesh, rules):
    """nnx.eval_shape of the model: nothing allocated (under the mesh and rules, as Flax's eager
    sharding wants annotated variables created)."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules.rules):
        return nnx.eval_shape(lambda: build(config, nnx.Rngs(0)))


def orbax_target(abstract_module, tessel_target):
    """Orbax's restore target for an NNX module's state: its structure, tessel's leaves (shapes,
    dtypes and shardings) in place of nnx.eval_shape's sharding-less ones."""
    state = nnx.state(abstract_module)
    nnx.replace_by_pure_dict(state, tessel_target)
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="transformer", choices=["dot_relu_dot", "transformer"])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    rules = tessel.load_rules(RULES)
    model_yaml, config = model_config(args.model)
    if args.model == "dot_relu_dot":
        config = dict(config, depth=256, hidden=1024)  # the guide's shapes take a while on 2 cores
        model_yaml = config

    # 1. Create the model sharded, fsdp=8, as the guide does; compare every spec with tessel's plan.
    save_mesh = tessel.Mesh({"data": 1, "fsdp": 8, "tensor": 1})
    model = create_sharded(config, jax_mesh(save_mesh), rules)
    ours, theirs = tessel_specs(model_yaml, save_mesh, rules), nnx_specs(model, rules)
    assert ours == theirs, (ours, theirs)
    print(f"1. {len(ours)} parameters created sharded on {save_mesh}; NNX's specs equal tessel's plan:")
    print(tessel.plan(model_yaml, save_mesh, rules, optimizer="adamw"))

    # 2. Checkpoint with Orbax; restore onto data=2,fsdp=4 with tessel's abstract state as the target.
    load_mesh = tessel.Mesh({"data": 2, "fsdp": 4, "tensor": 1})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state")
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path, nnx.state(model))
        abstract = abstract_model(config, jax_mesh(load_mesh), rules)
        target = orbax_target(abstract, tessel.eval_shape(model_yaml, load_mesh, rules, as_jax=True))
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(path, target)
    loaded = nnx.merge(nnx.graphdef(abstract), restored)
    held = per_device_bytes(nnx.state(loaded))
    total = sum(a.nbytes for a in jax.tree.leaves(nnx.state(model)))
    print(f"2. restored onto {load_mesh}: {total / 2**20:.1f} MiB of parameters, per device at most "
          f"{max(held.values()) / 2**20:.2f} MiB ({max(held.values()) / total:.1%}); "
          f"process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")

    # 3. Train a few steps with the inputs sharded on the batch axes.
    jmesh = jax_mesh(load_mesh)
    with jax.set_mesh(jmesh), nnx.logical_axis_rules(rules.rules):
        optimizer = nnx.Optimizer(loaded, optax.adamw(1e-3), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: m.loss(x, y))(model)
            optimizer.update(model, grads)
            return loss

        rng = np.random.default_rng(0)
        batch = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec(("data", "fsdp")))
        for t in range(args.steps):
            if args.model == "dot_relu_dot":
                x = rng.standard_normal((16, config["depth"]), np.float32)
                y = np.tanh(x)
            else:
                tokens = rng.integers(0, config["vocab"], (16, 33), np.int32)
                x, y = tokens[:, :-1], tokens[:, 1:]
            loss = step(loaded, optimizer, jax.device_put(x, batch), jax.device_put(y, batch))
            print(f"3. step {t + 1}: loss {float(loss):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
