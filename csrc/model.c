/* model.c — the model struct described as data: the slot and hyper-parameter tables and the enums'
 * names, made from pyllm.h's lists; the check that every present slot has the shape and type the
 * model's sizes imply; the packed copies of its matrices. */
#include <stddef.h>

#include "kernels.h"
#include "packed.h"

#define PL_LAYER_ENTRY(kind, name, rows, cols, required) \
    {#name, PL_SLOT_##kind, PL_DIM_##rows, PL_DIM_##cols, required, offsetof(pl_layer, name)},
#define PL_MODEL_ENTRY(kind, name, rows, cols, required) \
    {#name, PL_SLOT_##kind, PL_DIM_##rows, PL_DIM_##cols, required, offsetof(pl_model, name)},

static const pl_slot layer_slots[] = {PL_LAYER_SLOTS(PL_LAYER_ENTRY)};
static const pl_slot model_slots[] = {PL_MODEL_SLOTS(PL_MODEL_ENTRY)};

int pl_layer_slot_count(void) { return (int)(sizeof layer_slots / sizeof layer_slots[0]); }
int pl_model_slot_count(void) { return (int)(sizeof model_slots / sizeof model_slots[0]); }
const pl_slot *pl_layer_slot(int i) { return i >= 0 && i < pl_layer_slot_count() ? &layer_slots[i] : NULL; }
const pl_slot *pl_model_slot(int i) { return i >= 0 && i < pl_model_slot_count() ? &model_slots[i] : NULL; }

#define PL_HPARAM_ENTRY(type, name, names) {#name, PL_HPARAM_##type, names, offsetof(pl_model, name)},

static const pl_hparam hparams[] = {PL_HPARAMS(PL_HPARAM_ENTRY)};

int pl_hparam_count(void) { return (int)(sizeof hparams / sizeof hparams[0]); }
const pl_hparam *pl_hparam_at(int i) { return i >= 0 && i < pl_hparam_count() ? &hparams[i] : NULL; }

#define PL_ENUM_NAME(constant, name) [constant] = #name,
#define PL_NAME_FUNCTION(function, list)                                                          \
    const char *function(int i) {                                                                 \
        static const char *const names[] = {list(PL_ENUM_NAME)};                                  \
        return i >= 0 && i < (int)(sizeof names / sizeof names[0]) ? names[i] : NULL;            \
    }

PL_NAME_FUNCTION(pl_activation_name, PL_ACTIVATION_LIST)
PL_NAME_FUNCTION(pl_norm_kind_name, PL_NORM_KIND_LIST)
PL_NAME_FUNCTION(pl_slot_kind_name, PL_SLOT_KIND_LIST)
PL_NAME_FUNCTION(pl_dim_name, PL_DIM_LIST)
PL_NAME_FUNCTION(pl_trace_point_name, PL_TRACE_POINT_LIST)

static int64_t dim_size(const pl_model *m, int d) {
    switch (d) {
    case PL_DIM_DIM: return m->dim;
    case PL_DIM_Q: return (int64_t)m->n_heads * m->head_dim;
    case PL_DIM_KV: return (int64_t)m->n_kv_heads * m->head_dim;
    case PL_DIM_FFN: return m->ffn_dim;
    case PL_DIM_HEAD: return m->head_dim;
    case PL_DIM_VOCAB: return m->vocab_size;
    case PL_DIM_POS: return m->n_positions;
    default: return 1;
    }
}

static const char *check_slot(const pl_model *m, const pl_slot *slot, const void *owner) {
    const char *field = (const char *)owner + slot->offset;
    if (slot->kind == PL_SLOT_MATRIX) {
        const pl_tensor *t = (const pl_tensor *)field;
        if (!t->data) return slot->required ? "a required weight is missing" : NULL;
        if (!pl_traits(t->type) || !pl_traits(t->type)->vec_dot) return "a weight has a type pyllm cannot multiply";
        if (t->rows != dim_size(m, slot->rows) || t->cols != dim_size(m, slot->cols))
            return "a weight's shape does not match the model";
        if (pl_row_size(t->type, t->cols) < 0) return "a weight's rows are not whole blocks";
        return NULL;
    }
    if (slot->kind == PL_SLOT_NORM) {
        const pl_norm *n = (const pl_norm *)field;
        if (!n->w) return slot->required ? "a required norm is missing" : NULL;
        if (n->kind != PL_NORM_RMS && n->kind != PL_NORM_LAYER) return "a norm has an unknown kind";
        if (n->kind == PL_NORM_RMS && n->b) return "an RMS norm cannot take a bias";
        return NULL;
    }
    return NULL; /* a bias vector: its length is the binder's to check */
}

const char *pl_model_check(const pl_model *m) {
    if (m->n_layers < 1 || m->dim < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->head_dim < 1 ||
        m->ffn_dim < 1 || m->vocab_size < 1 || m->n_positions < 0)
        return "a model dimension is not positive";
    /* ModelSpec refuses these first; here only because attention would read past the last KV head */
    if (m->n_heads % m->n_kv_heads) return "n_heads must be a multiple of n_kv_heads";
    if (m->n_rot < 0 || m->n_rot > m->head_dim || m->n_rot % 2) return "n_rot must be even and at most head_dim";
    if (m->n_rot && (m->n_ropes < 1 || m->n_ropes > PL_MAX_ROPES)) return "the model has no rotary table";
    for (int r = 0; m->n_rot && r < m->n_ropes; r++)
        if (!m->ropes[r].inv_freq) return "a rotary table is missing";
    if (!m->layers) return "the model has no layers";
    if (m->attn_softcap < 0 || m->logit_softcap < 0) return "a soft-cap is negative";
    if (m->activation != PL_ACT_SILU && m->activation != PL_ACT_GELU_TANH) return "unknown activation";
    if (m->pos_embd.data && m->n_positions < 1) return "learned positions need n_positions";
    const char *e;
    for (int i = 0; i < pl_model_slot_count(); i++)
        if ((e = check_slot(m, &model_slots[i], m))) return e;
    for (int l = 0; l < m->n_layers; l++) {
        const pl_layer *L = &m->layers[l];
        for (int i = 0; i < pl_layer_slot_count(); i++)
            if ((e = check_slot(m, &layer_slots[i], L))) return e;
        if (L->sliding_window < 0) return "a sliding window is negative";
        if (!L->w_gate.data && m->activation != PL_ACT_GELU_TANH) return "a plain MLP runs gelu_tanh only";
        if (m->n_rot && (L->rope < 0 || L->rope >= m->n_ropes)) return "a layer names a rotary table that does not exist";
    }
    return NULL;
}

/* ---------------------------------------------------------------- packed copies */

typedef struct {
    pl_tensor *t;
    int64_t g0, g1;
} pack_job;

static void pack_task(void *arg, int ith, int nth) {
    const pack_job *j = arg;
    int64_t n = j->g1 - j->g0;
    pl_pack_groups(j->t->type, j->t->data, j->t->rows, j->t->cols, j->t->packed, j->g0 + n * ith / nth,
                   j->g0 + n * (ith + 1) / nth);
}

/* Bytes t's copy takes in the model's block, each copy starting on a cache line: its packed copy
 * where its type has a packed kernel, else its rows as stored; -1 where it cannot be packed. */
static int64_t placed_bytes(const pl_tensor *t) {
    int64_t b = pl_packed_type(t->type) ? pl_packed_bytes(t->type, t->rows, t->cols)
                                        : pl_row_size(t->type, t->cols) * t->rows;
    return b < 0 ? -1 : (b + 63) / 64 * 64;
}

int pl_model_reserve_weights(pl_model *m, pl_tensor *const *ts, int n, void **places) {
    if (m->weights_block || n < 0) return PL_ERR_ARGS;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i]->data || ts[i]->packed || placed_bytes(ts[i]) < 0) return PL_ERR_ARGS;
        bytes += (size_t)placed_bytes(ts[i]);
    }
    if (!bytes) return PL_OK;
    char *block = pl_alloc_swept(bytes);
    if (!block) return PL_ERR_NOMEM;
    m->weights_block = block;
    m->weights_block_bytes = bytes;
    for (int i = 0; i < n; i++) {
        places[i] = block;
        if (pl_packed_type(ts[i]->type)) ts[i]->packed = block;
        block += placed_bytes(ts[i]);
    }
    return PL_OK;
}

int pl_tensor_pack(pl_tensor *t, pl_pool *pool, int64_t g0, int64_t g1) {
    if (!t->data || !pl_packed_type(t->type)) return PL_OK;
    if (!t->packed || g0 < 0 || g1 < g0 || g1 > (t->rows + PL_PACK_ROWS - 1) / PL_PACK_ROWS) return PL_ERR_ARGS;
    pack_job j = {t, g0, g1};
    pl_pool_run(pool, pack_task, &j);
    return PL_OK;
}

static void unpack_slots(char *owner, const pl_slot *slots, int count) {
    for (int i = 0; i < count; i++)
        if (slots[i].kind == PL_SLOT_MATRIX) ((pl_tensor *)(owner + slots[i].offset))->packed = NULL;
}

void pl_model_unpack(pl_model *m) {
    unpack_slots((char *)m, model_slots, pl_model_slot_count());
    for (int l = 0; m->layers && l < m->n_layers; l++)
        unpack_slots((char *)&m->layers[l], layer_slots, pl_layer_slot_count());
    pl_free_swept(m->weights_block, m->weights_block_bytes);
    m->weights_block = NULL;
    m->weights_block_bytes = 0;
}
