/* ops.c — the per-row elementwise operations of a transformer block, in float32. */
#include <math.h>

#include "kernels.h"

/* out = x / sqrt(mean(x²) + eps) · w, as Llama's RMSNorm computes it in float32. */
void pl_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = pl_vec.dot_f32(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* Rotates each head of x in place by the angles whose cos/sin are given (head_dim / 2 of each).
 * HF checkpoints pair element i with i + head_dim/2; llama.cpp's GGUF llama files pair 2i, 2i+1. */
void pl_rope(float *x, int n_heads, int head_dim, const float *cos, const float *sin,
             int interleaved) {
    int half = head_dim / 2;
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

/* gate = gelu_tanh(gate) · up */
void pl_geglu_tanh(float *gate, const float *up, int n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}
