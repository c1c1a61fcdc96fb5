"""tessel's transformer LM (src/tessel/nn/models.cpp) and DotReluDot in JAX: the reference model of
test_numerics_vs_jax.py (which proves it computes what tessel computes) and the jax.jit peer of
bench/train_bench.sh. Parameters are the tree tessel saves: MaxText's names, layers stacked on
axis 1 (a vector's layer axis is its last).
"""
import jax
import jax.numpy as jnp
import numpy as np


def rms_norm(x, scale, eps=1e-5):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rope(x):
    """MaxText's rotary embedding on [batch, seq, heads, head_dim]: halves paired, timescale 1e4."""
    d = x.shape[-1]
    half = d // 2
    timescale = 10000.0 ** (2.0 * jnp.arange(half, dtype=jnp.float32) / d)
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] / timescale[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention(cfg, w, x):
    b, s, e = x.shape
    h, kv = cfg["heads"], cfg.get("kv_heads", cfg["heads"])
    d = e // h
    q = (x @ w["self_attention"]["query"]["kernel"].reshape(e, h * d)).reshape(b, s, h, d)
    k = (x @ w["self_attention"]["key"]["kernel"].reshape(e, kv * d)).reshape(b, s, kv, d)
    v = (x @ w["self_attention"]["value"]["kernel"].reshape(e, kv * d)).reshape(b, s, kv, d)
    q = rope(q) / np.sqrt(d)
    k = rope(k)
    # Query head j shares key/value head j // (h // kv), as tessel groups them.
    k = jnp.repeat(k, h // kv, axis=2)
    v = jnp.repeat(v, h // kv, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores, -0.7 * jnp.finfo(jnp.float32).max)
    context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, h * d)
    return context @ w["self_attention"]["out"]["kernel"].reshape(h * d, e)


def mlp(w, x):
    return jax.nn.gelu(x @ w["mlp"]["wi"]["kernel"], approximate=True) @ w["mlp"]["wo"]["kernel"]


def logits_of(cfg, params, tokens):
    x = params["token_embedder"]["embedding"][tokens]
    stacked = params["decoder"]["layers"]
    for i in range(cfg["layers"]):
        w = jax.tree.map(lambda p: jnp.take(p, i, axis=1), stacked)  # layers on axis 1 (vectors: last)
        x = x + attention(cfg, w, rms_norm(x, w["pre_self_attention_layer_norm"]["scale"]))
        x = x + mlp(w, rms_norm(x, w["post_self_attention_layer_norm"]["scale"]))
    x = rms_norm(x, params["decoder"]["decoder_norm"]["scale"])
    return x @ params["decoder"]["logits_dense"]["kernel"]


def loss_fn(cfg, params, inputs, targets):
    logp = jax.nn.log_softmax(logits_of(cfg, params, inputs), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))



def dot_relu_dot_loss(params, x, y):
    """DotReluDot (the Flax NNX guide's model) with the regression loss tessel trains it on."""
    return jnp.mean((jax.nn.relu(x @ params["dot1"]["kernel"]) @ params["w2"] - y) ** 2)
