"""The jax.jit peer of bench/train_bench.sh: the same two models and steps as bench_train, written
in JAX (tests/python/jax_lm.py, the model the numerics cross-check proves equal to tessel's), one
jitted train step each, timed after warm-up, with the parameters, optimizer state and batch placed
by the same logical axis rules (tessel train's defaults) through Flax's logical_to_mesh_sharding.

  jax_peer.py DEVICES MESH...   -> one JSON line per mesh: {"model", "mesh", "step_s"}

DEVICES host CPU devices (XLA_FLAGS is set here, before JAX starts; bench/jax_rounds.py, which
imports step_fn, sets it itself). A mesh is "data=8" style; "mlp:" or "lm:" before it picks the
model. DotReluDot: x[512,1024] @ W1[1024,4096] -> relu -> @ W2[4096,1024], MSE, SGD at 1e-3. LM:
vocab 256, embed 256, 4 layers, 4 heads, MLP 1024, batch 16 x seq 128, AdamW (b1 0.9, b2 0.95,
eps 1e-8, weight decay 0.1) after global-norm clipping at 1.
"""
import json
import os
import sys
import time

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

from jax_lm import dot_relu_dot_loss, loss_fn  # noqa: E402

# tessel train's default rules (src/tessel/nn/train.cpp).
AXES = ("data", "fsdp", "tensor")
RULES = [("activation_batch", ("data", "fsdp")), ("batch", ("data", "fsdp")), ("vocab", "tensor"),
         ("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("q_heads", "tensor"),
         ("kv_heads", "tensor"), ("kv", None), ("norm", None), ("layers", None)]
LM = {"vocab": 256, "embed": 256, "layers": 4, "heads": 4, "mlp": 1024}


def lm_params(rng):
    e, h, d, m, L, v = LM["embed"], LM["heads"], LM["embed"] // LM["heads"], LM["mlp"], LM["layers"], LM["vocab"]
    normal = lambda shape, fan: (rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)  # noqa: E731
    layers = {
        "pre_self_attention_layer_norm": {"scale": (np.ones((e, L), np.float32), ("norm", "layers"))},
        "post_self_attention_layer_norm": {"scale": (np.ones((e, L), np.float32), ("norm", "layers"))},
        "self_attention": {
            "query": {"kernel": (normal((e, L, h, d), e), ("embed", "layers", "q_heads", "kv"))},
            "key": {"kernel": (normal((e, L, h, d), e), ("embed", "layers", "kv_heads", "kv"))},
            "value": {"kernel": (normal((e, L, h, d), e), ("embed", "layers", "kv_heads", "kv"))},
            "out": {"kernel": (normal((h, L, d, e), h * d), ("heads", "layers", "kv", "embed"))},
        },
        "mlp": {"wi": {"kernel": (normal((e, L, m), e), ("embed", "layers", "mlp"))},
                "wo": {"kernel": (normal((m, L, e), m), ("mlp", "layers", "embed"))}},
    }
    return {"token_embedder": {"embedding": (normal((v, e), 1), ("vocab", "embed"))},
            "decoder": {"layers": layers, "decoder_norm": {"scale": (np.ones(e, np.float32), ("norm",))},
                        "logits_dense": {"kernel": (normal((e, v), e), ("embed", "vocab"))}}}


def mlp_params(rng):
    return {"dot1": {"kernel": ((rng.standard_normal((1024, 4096)) / 32).astype(np.float32), ("embed", "mlp"))},
            "w2": ((rng.standard_normal((4096, 1024)) / 64).astype(np.float32), ("mlp", "embed"))}


def is_pair(x):
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray)


def timed(step, seconds=3.0):
    for _ in range(2):
        step()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 3:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def step_fn(model, mesh_text):
    """One jitted train step of `model` ("mlp" or "lm") on the mesh, its state carried from call to
    call; returns when the step's loss is ready."""
    sizes = dict(item.split("=") for item in mesh_text.split(","))
    shape = tuple(int(sizes.get(a, 1)) for a in AXES)
    mesh = Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), AXES)
    place = lambda logical: nn.logical_to_mesh_sharding(P(*logical), mesh, RULES)  # noqa: E731
    rng = np.random.default_rng(0)
    tree = mlp_params(rng) if model == "mlp" else lm_params(rng)
    params = jax.tree.map(lambda pair: jax.device_put(pair[0], place(pair[1])), tree, is_leaf=is_pair)
    if model == "mlp":
        x = jax.device_put(rng.standard_normal((512, 1024)).astype(np.float32), place(("activation_batch", None)))
        y = jax.device_put(np.sin(np.asarray(x)), place(("activation_batch", None)))
        optimizer = optax.sgd(1e-3)
        loss = dot_relu_dot_loss
    else:
        tokens = rng.integers(0, 256, (16, 129)).astype(np.int32)
        x = jax.device_put(tokens[:, :-1], place(("activation_batch", None)))
        y = jax.device_put(tokens[:, 1:], place(("activation_batch", None)))
        optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                                optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
        loss = lambda p, a, b: loss_fn(LM, p, a, b)  # noqa: E731
    # mu and nu sharded like the parameters; the step count replicated on the mesh.
    opt_state = jax.jit(optimizer.init)(params)
    replicated = jax.sharding.NamedSharding(mesh, P())
    opt_state = jax.tree.map(lambda a: a if len(a.sharding.device_set) == mesh.size else jax.device_put(a, replicated),
                             opt_state)
    shardings = (jax.tree.map(lambda a: a.sharding, params), jax.tree.map(lambda a: a.sharding, opt_state))

    def train_step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    # The state keeps its sharding from step to step, updated in place (donated), as tessel's does.
    step = jax.jit(train_step, out_shardings=(*shardings, None), donate_argnums=(0, 1))
    state = {"params": params, "opt": opt_state}

    def one():
        state["params"], state["opt"], value = step(state["params"], state["opt"], x, y)
        jax.block_until_ready(value)

    return one


if __name__ == "__main__":
    for arg in sys.argv[2:]:
        model, mesh_text = arg.split(":")
        print(json.dumps({"model": model, "mesh": mesh_text, "devices": int(sys.argv[1]), "jax": jax.__version__,
                          "step_s": timed(step_fn(model, mesh_text))}), flush=True)
