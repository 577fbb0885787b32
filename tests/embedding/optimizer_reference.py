"""The fused optimizers' update rules written out in float64, independently of
cc/embedding/optimizer.h: the reference of the optimizer and module tests."""

import math

import torch


def reference_step(opt, w, s, g, t):
    """One update of a float64 row (w: dim, s: state) by the rules of
    cc/embedding/optimizer.h, written independently."""
    lr, wd, mode = opt.learning_rate, opt.weight_decay, opt.weight_decay_mode
    dim = w.numel()
    name = opt.optimizer.name
    if name in ("SGD", "EXACT_SGD"):
        return w - lr * (g + (wd * w if mode == 1 else 0)), s
    if name == "ADAM":
        m = opt.beta1 * s[:dim] + (1 - opt.beta1) * g
        v = opt.beta2 * s[dim:] + (1 - opt.beta2) * g * g
        mh, vh = m / (1 - opt.beta1**t), v / (1 - opt.beta2**t)
        return w - lr * (mh / (vh.sqrt() + opt.eps) + wd * w), torch.cat([m, v])
    if name == "EXACT_ADAGRAD":
        gg = g + (wd * w if mode == 1 else 0)
        G = s + gg * gg
        return w - lr * gg / (G.sqrt() + opt.eps), G
    if name == "EXACT_ROWWISE_ADAGRAD":
        gg = g + (wd * w if mode == 1 else 0)
        G = s.clone()
        G[0] += (gg * gg).mean()
        k = lr / (math.sqrt(float(G[0])) + opt.eps)
        c = 1 - k * wd if mode == 1 else (1 - lr * wd if mode == 2 else 1.0)
        return c * w - k * g, G
    if name == "FTRL":
        p = opt.learning_rate_power
        lin, n0 = s[:dim], s[dim:]
        n1 = n0 + g * g
        lin = lin + g - (n1 ** (-p) - n0 ** (-p)) / lr * w
        denom = (opt.ftrl_beta + n1 ** (-p)) / lr + opt.l2_reg
        new_w = torch.where(
            lin.abs() <= opt.l1_reg,
            torch.zeros_like(w),
            (torch.sign(lin) * opt.l1_reg - lin) / denom,
        )
        return new_w, torch.cat([lin, n1])
    if name == "ROWWISE_RMSPROP_AR":
        return rmsprop_ar_step(opt, w, s, g, t)
    raise AssertionError(name)


def rmsprop_ar_step(opt, w, s, g, t):
    """Row-wise RMSprop with adaptive regularization (FBGEMM's rule, its
    docstring's equations) plus the warm-up of new rows, in float64. s: the
    row's state (ema of mean(g^2), step of its last update (0: never), its
    updates so far, a spare)."""
    s = s.clone()
    v = opt.ema_beta * s[0] + (1 - opt.ema_beta) * (g * g).mean()
    gap = 1.0 if s[1] == 0 else t - float(s[1])
    lam = min(1.0, max(0.0, opt.learning_rate * opt.ar_alpha * gap))
    shrink = max(opt.min_shrinkage, 1.0 - lam)
    warm = 1.0
    if opt.row_warmup_steps:
        warm = min(1.0, (float(s[2]) + 1) / opt.row_warmup_steps)
    k = opt.learning_rate * warm / (math.sqrt(float(v)) + opt.eps)
    s[0], s[1], s[2] = v, t, s[2] + 1
    return shrink * w - k * g, s
