/* ops.c — the per-row elementwise operations of a transformer block, in float32. */
#include <math.h>

#include "kernels.h"

/* out = x / sqrt(mean(x²) + eps) · w, as Llama's RMSNorm computes it in float32. */
void pl_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = pl_vec.dot_f32(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* out = (x - mean) / sqrt(var + eps) · w + b (b may be NULL), the biased variance as torch's
 * LayerNorm takes it; two passes, so large means do not cancel the variance away. */
void pl_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    float mean = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    float var = 0.0f;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    float scale = 1.0f / sqrtf(var / (float)n + eps);
    if (b)
        for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * scale * w[i] + b[i];
    else
        for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * scale * w[i];
}

void pl_norm_apply(float *out, const float *x, const pl_norm *norm, int n, float eps) {
    if (norm->kind == PL_NORM_LAYER)
        pl_layernorm(out, x, norm->w, norm->b, n, eps);
    else
        pl_rmsnorm(out, x, norm->w, n, eps);
}

/* Rotates the first n_rot dims of each head of x in place by the angles whose cos/sin are given
 * (n_rot / 2 of each); the rest of the head passes unchanged. HF checkpoints pair element i with
 * i + n_rot/2; llama.cpp's GGUF llama files pair 2i, 2i+1. */
void pl_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cos, const float *sin,
             int interleaved) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = interleaved ? 2 * i : i;
            int b = interleaved ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cos[i] - x1 * sin[i];
            v[b] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

/* x = cap · tanh(x / cap): Gemma 2's soft limit on attention scores and final logits. */
void pl_softcap(float *x, int64_t n, float cap) {
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

void pl_softmax_scalar(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* gate = silu(gate) · up */
void pl_swiglu_scalar(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* gelu_tanh(g) = 0.5·g·(1 + tanh(sqrt(2/pi)·(g + 0.044715·g³))), as torch's approximate="tanh". */
static inline float gelu_tanh(float g) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

/* gate = gelu_tanh(gate) · up */
void pl_geglu_scalar(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) gate[i] = gelu_tanh(gate[i]) * up[i];
}

/* x = gelu_tanh(x): the activation of a plain (ungated) MLP */
void pl_gelu_scalar(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = gelu_tanh(x[i]);
}
