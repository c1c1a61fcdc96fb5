"""The peer for bench/train_bench.sh: the same two models as bench_train in plain torch.nn, one
train step each, timed after warm-up, and PyTorch's SGEMM rate on the shapes bench_train's
BM_Sgemm measures. Usage: torch_peer.py THREADS  -> JSON on stdout. bench/torch_rounds.py imports
the models' steps (mlp_step_fn, lm_step_fn).

DotReluDot: x[512,1024] @ W1[1024,4096] -> relu -> @ W2[4096,1024], MSE, SGD (no bias).
LM: vocab 256, embed 256, 4 layers, 4 heads (head_dim 64), MLP 1024 with tanh-gelu, RMSNorm
(eps 1e-5) before attention and MLP, rotary positions, causal softmax attention, untied logits,
batch 16 x seq 128, AdamW(b1 0.9, b2 0.95, eps 1e-8, wd 0.1) with global-norm clipping at 1.
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def use_threads(threads):
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass


class DotReluDot(nn.Module):
    def __init__(self):
        super().__init__()
        self.dot1 = nn.Linear(1024, 4096, bias=False)
        self.w2 = nn.Linear(4096, 1024, bias=False)

    def forward(self, x):
        return self.w2(F.relu(self.dot1(x)))


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def rope(x):  # x: [b, s, h, d], halves of d paired (MaxText's layout)
    b, s, h, d = x.shape
    half = d // 2
    pos = torch.arange(s, dtype=torch.float32)[:, None]
    inv = 1.0 / (10000.0 ** (2.0 * torch.arange(half, dtype=torch.float32) / d))
    ang = pos * inv  # [s, half]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(nn.Module):
    def __init__(self, e, h, m):
        super().__init__()
        self.h, self.d = h, e // h
        self.n1, self.n2 = RMSNorm(e), RMSNorm(e)
        self.q = nn.Linear(e, e, bias=False)
        self.k = nn.Linear(e, e, bias=False)
        self.v = nn.Linear(e, e, bias=False)
        self.o = nn.Linear(e, e, bias=False)
        self.wi = nn.Linear(e, m, bias=False)
        self.wo = nn.Linear(m, e, bias=False)

    def forward(self, x, mask):
        b, s, e = x.shape
        y = self.n1(x)
        q = rope(self.q(y).view(b, s, self.h, self.d)) / math.sqrt(self.d)
        k = rope(self.k(y).view(b, s, self.h, self.d))
        v = self.v(y).view(b, s, self.h, self.d)
        scores = torch.matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(2, 3)) + mask
        ctx = torch.matmul(scores.softmax(-1), v.transpose(1, 2)).transpose(1, 2).reshape(b, s, e)
        x = x + self.o(ctx)
        return x + self.wo(F.gelu(self.wi(self.n2(x)), approximate="tanh"))


class LM(nn.Module):
    def __init__(self, vocab=256, e=256, layers=4, h=4, m=1024):
        super().__init__()
        self.emb = nn.Embedding(vocab, e)
        self.layers = nn.ModuleList([Layer(e, h, m) for _ in range(layers)])
        self.norm = RMSNorm(e)
        self.logits = nn.Linear(e, vocab, bias=False)

    def forward(self, tokens):
        s = tokens.shape[1]
        mask = torch.full((s, s), float("-inf")).triu(1)
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        return self.logits(self.norm(x))


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
    return times[len(times) // 2]  # the median step


def mlp_step_fn():
    """One DotReluDot train step (a fresh model, optimizer and batch)."""
    mlp = DotReluDot()
    sgd = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    x, y = torch.randn(512, 1024), torch.randn(512, 1024)

    def step():
        sgd.zero_grad(set_to_none=True)
        F.mse_loss(mlp(x), y).backward()
        sgd.step()
    return step


def lm_step_fn():
    """One LM train step (a fresh model, optimizer and batch); also the model's parameter count."""
    lm = LM()
    adamw = torch.optim.AdamW(lm.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tokens = torch.randint(0, 256, (16, 129))

    def step():
        adamw.zero_grad(set_to_none=True)
        logits = lm(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        adamw.step()
    return step, sum(p.numel() for p in lm.parameters())


# The SGEMM rate on the shapes bench_train's BM_Sgemm measures (m, n, k, bit 0: A transposed,
# bit 1: B transposed), with every thread: what PyTorch's BLAS gives these models.
GEMM_SHAPES = [(512, 4096, 1024, 0), (512, 1024, 4096, 2), (1024, 4096, 512, 1), (2048, 1024, 256, 0),
               (2048, 256, 1024, 2), (256, 1024, 2048, 1), (2048, 256, 256, 0)]


def gemm_gflops(m, n, k, trans):
    a = torch.randn(k, m).t() if trans & 1 else torch.randn(m, k)
    b = torch.randn(n, k).t() if trans & 2 else torch.randn(k, n)
    return 2.0 * m * n * k / timed(lambda: torch.mm(a, b), seconds=0.5) / 1e9


def main():
    threads = int(sys.argv[1])
    use_threads(threads)
    torch.manual_seed(0)
    mlp_step = mlp_step_fn()
    lm_step, lm_params = lm_step_fn()
    blas = "MKL" if torch.backends.mkl.is_available() else "not MKL"
    print(json.dumps({"threads": threads, "torch": torch.__version__, "mlp_s": timed(mlp_step), "lm_s": timed(lm_step),
                      "lm_params": lm_params, "blas": blas,
                      "gemm_gflops": [gemm_gflops(*shape) for shape in GEMM_SHAPES]}))


if __name__ == "__main__":
    main()
