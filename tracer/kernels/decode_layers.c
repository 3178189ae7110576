/* A decode step of a few sequences through all of the decoder's layers in one call: what
 * fused_decoder.py's loop does layer by layer, with the same functions in the same order (so the
 * same bits), without going back to Python between them. At one sequence that loop makes ~270
 * calls a step, and each costs 15-25 us of Python around a few microseconds of C
 * (docs/benchmarks.md, thirteenth round). Two steps are fused further: the gate_up linear and SiLU
 * (gate_up_silu; twenty-eighth round; on AMX amx_gate_up_silu, forty-fifth), and the rotary with
 * the K/V write into attention's tasks, each turning and writing its own token (paged_decode.c:
 * place_token; twenty-ninth round).
 *
 * float32 or bfloat16 (the KV cache bfloat16 under float32 too: kv_cache_dtype); every row one
 * sequence's decode token; every linear packed for oneDNN and
 * read by packed_gemv (float32) or, in bfloat16, amx_gemv (AMX) or dpbf16_gemv (AVX512_BF16), with
 * the chunk packed_linear.py agreed on. Built at first use by tracer/kernels/build.py, from this
 * file and the five it includes. */
#include "amx_gemv.c"
#include "dpbf16_gemv.c"
#include "fused_ops.c"
#include "packed_gemv.c"
#include "paged_decode.c"

#include <stdlib.h>

typedef struct { /* one linear (packed_linear.py: FewRowsLinear) */
    const void *weight, *bias; /* bias NULL for none */
    int64_t in, in_padded, out, chunk;
} linear_t;

typedef struct { /* one decoder layer (fused_decoder.py: LayerParts), and its KV cache */
    const void *input_norm, *post_attention_norm;
    float input_eps, post_attention_eps;
    linear_t qkv, o, gate_up, down;
    void *k_cache, *v_cache;
} layer_t;

typedef struct { /* what every layer shares in this step */
    int64_t rows, hidden, heads, kv_heads, dim, intermediate;
    float scale;
    const void *cos, *sin;
    const int64_t *positions, *slot_mapping;
    const int32_t *block_tables, *seq_lens; /* [rows, max_blocks], [rows] */
    int64_t num_blocks, block_size, max_blocks;
    int64_t silu_run; /* fused_ops.py: silu_vector_run */
    int threads;
    int is_bf16; /* every tensor bfloat16, else float32 */
    int kv_bf16; /* the KV cache bfloat16 (under a float32 model: kv_cache_dtype) */
    int amx;     /* the CPU has AMX: bfloat16 linears on its tiles (on_amx), else by VDPBF16PS */
} step_t;

/* Whether the linears run on AMX's tiles: bfloat16 where the CPU has them */
static int on_amx(const step_t *s) { return s->is_bf16 && s->amx; }

static void linear(const linear_t *l, const void *x, void *y, const step_t *s) {
    if (on_amx(s))
        amx_gemv(x, l->weight, l->bias, y, s->rows, l->in, l->out, s->threads);
    else if (s->is_bf16)
        dpbf16_gemv(x, l->weight, l->bias, y, s->rows, l->in, l->out, l->chunk, s->threads);
    else
        packed_gemv(x, l->weight, l->bias, y, s->rows, l->in, l->in_padded, l->out, l->chunk,
                    s->threads);
}

/* Outputs [first, last) of a linear's block blk for n rows into y [n][BLOCK], by the kernel
 * linear() calls where there is no AMX; the thread goes on to block `then` (its weights asked for
 * while this block's are read). */
static void block_of(const linear_t *l, const void *x, int64_t blk, int64_t then, int64_t n,
                     int64_t first, int64_t last, void *y, int bf16) {
    if (!bf16) {
        const float *w = l->weight, *bias = l->bias;
        block_outputs(x, w + blk * l->in_padded * BLOCK, w + then * l->in_padded * BLOCK,
                      bias ? bias + blk * BLOCK : 0, y, n, l->in, l->in_padded, l->chunk, BLOCK,
                      first, last);
        return;
    }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    const uint16_t *w = l->weight, *bias = l->bias;
    dp_block_outputs(x, w + blk * l->in * DP_BLOCK, w + then * l->in * DP_BLOCK,
                     bias ? bias + blk * DP_BLOCK : 0, y, n, l->in, l->chunk, DP_BLOCK, first,
                     last);
#endif
}

/* Block b's outputs [first, last) of act for rows r0 .. r0 + n: silu(gate) * up, gate and up the
 * block's outputs [n][BLOCK]; as silu_and_mul, the row's elements before `vectorized` through
 * SLEEF's exp */
INLINE void silu_block(const char *gate, const char *up, char *act, int64_t r0, int64_t n,
                       int64_t width, int64_t b, int64_t first, int64_t last, int64_t vectorized,
                       const int bf16) {
    const int64_t size = bf16 ? 2 : 4, column = b * BLOCK + first;
    int64_t sleef = vectorized - column; /* of this block's [first, last) */
    sleef = sleef < 0 ? 0 : sleef > last - first ? last - first : sleef;
    for (int64_t r = 0; r < n; ++r) {
        const int64_t at = (r * BLOCK + first) * size;
        silu_span(gate + at, up + at, act + ((r0 + r) * width + column) * size, last - first, sleef,
                  bf16);
    }
}

#ifdef __AVX512F__
/* A few rows through n whole blocks of a linear side by side (packed_gemv.c: few_rows_blocks),
 * by the kernel linear() calls where there is no AMX; block k's row r to y[k] + r * BLOCK. */
static void few_rows_of(const linear_t *l, const void *x, const int64_t *blocks, void *const *y,
                        int n, int64_t rows, int bf16) {
    if (!bf16) {
        few_rows_blocks(x, l->weight, l->bias, blocks, (float *const *)y, n, rows, l->in,
                        l->in_padded, l->chunk, BLOCK);
        return;
    }
#ifdef __AVX512BF16__
    dp_few_rows_blocks(x, l->weight, l->bias, blocks, (uint16_t *const *)y, n, rows, l->in,
                       l->chunk, BLOCK);
#endif
}

/* gate_up_silu's whole blocks [b0, b1) for a few rows: each block's gate and up outputs read side
 * by side, with as many blocks at once as shares.h's STREAMS_FOR allows. */
static void gate_up_silu_few_rows(const linear_t *l, const void *x, void *act, int64_t rows,
                                  int64_t b0, int64_t b1, int64_t vectorized, int bf16) {
    const int64_t width = l->out / 2, half = width / BLOCK, runs = STREAMS_FOR(rows) / 2;
    const int64_t per = (b1 - b0 + runs - 1) / runs; /* blocks a run */
    _Alignas(64) float out[STREAMS][FEW_ROWS * BLOCK]; /* gate, up, gate, up */
    for (int64_t j = 0; j < per; ++j) {
        int64_t gates[STREAMS / 2], blocks[STREAMS];
        void *y[STREAMS] = {out[0], out[1], out[2], out[3]};
        const int n = 2 * side_by_side(b0, b1, per, j, gates);
        for (int k = 0; k < n; k += 2) /* each gate block, then the same block of up's */
            blocks[k] = gates[k / 2], blocks[k + 1] = gates[k / 2] + half;
        few_rows_of(l, x, blocks, y, n, rows, bf16);
        for (int k = 0; k < n; k += 2)
            if (bf16)
                silu_block(y[k], y[k + 1], act, 0, rows, width, blocks[k], 0, BLOCK, vectorized, 1);
            else
                silu_block(y[k], y[k + 1], act, 0, rows, width, blocks[k], 0, BLOCK, vectorized, 0);
    }
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* gate_up_silu's whole blocks [b0, b1) for up to FEW float32 rows: each block of gate's outputs
 * read side by side with the same block of up's (packed_gemv.c: few_rows_two_blocks). */
static void gate_up_silu_few_rows(const linear_t *l, const float *x, void *act, int64_t rows,
                                  int64_t b0, int64_t b1, int64_t vectorized) {
    const int64_t width = l->out / 2, half = width / BLOCK;
    const float *weight = l->weight, *bias = l->bias;
    _Alignas(64) float gate[FEW * BLOCK], up[FEW * BLOCK];
    float *const y[2] = {gate, up};
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t blocks[2] = {b, b + half};
        const float *w[2], *bs[2];
        for (int k = 0; k < 2; ++k) {
            w[k] = weight + blocks[k] * l->in_padded * BLOCK;
            bs[k] = bias ? bias + blocks[k] * BLOCK : 0;
        }
        few_rows_two_blocks(x, w, bs, y, rows, l->in, l->chunk, BLOCK);
        silu_block((const char *)gate, (const char *)up, act, 0, rows, width, b, 0, BLOCK,
                   vectorized, 0);
    }
}
#endif

/* act [rows, width] = silu(gate) * up, gate and up the gate_up linear's two halves of outputs: a
 * thread computes a block of gate's outputs and the same block of up's and multiplies them at once,
 * while they are in its cache. linear() then silu_and_mul() wrote gate_up out and read it back,
 * from memory where the weights streaming through the cache had pushed it out meanwhile. The same
 * sums and the same SiLU: the same bits. Up to FEW_ROWS rows read the blocks a thread holds whole
 * several at a time (gate_up_silu_few_rows), as the few-row linears do; with AVX2 up to FEW rows
 * read a block of gate's and the same of up's side by side (its gate_up_silu_few_rows). */
static void gate_up_silu(const linear_t *l, const void *x, void *act, const step_t *s) {
    const int64_t width = l->out / 2, size = s->is_bf16 ? 2 : 4;
    const int64_t vectorized = silu_vectorized(width, s->silu_run);
#pragma omp parallel num_threads(s->threads)
    {
        _Alignas(64) char gate[SLAB * BLOCK * sizeof(float)], up[sizeof gate]; /* a block's */
        const share_t share = thread_share(width / BLOCK, PARTS);
        int64_t b0 = 0, b1 = 0; /* the blocks read side by side */
#ifdef __AVX512F__
        if (s->rows <= FEW_ROWS) {
            whole_blocks(share, PARTS, width / BLOCK, &b0, &b1);
            gate_up_silu_few_rows(l, x, act, s->rows, b0, b1, vectorized, s->is_bf16);
        }
#elif defined(__AVX2__) && defined(__FMA__)
        if (s->rows <= FEW && !s->is_bf16) {
            whole_blocks(share, PARTS, width / BLOCK, &b0, &b1);
            gate_up_silu_few_rows(l, x, act, s->rows, b0, b1, vectorized);
        }
#endif
        for (int64_t b = share.begin / PARTS; b * PARTS < share.end; ++b) {
            if (b >= b0 && b < b1) continue; /* read above */
            int64_t first, last;
            outputs_in_share(share, b, PARTS, BLOCK / PARTS, BLOCK, &first, &last);
            for (int64_t r = 0; first < last && r < s->rows; r += SLAB) {
                const int64_t n = s->rows - r < SLAB ? s->rows - r : SLAB;
                const char *xr = (const char *)x + r * l->in * size;
                block_of(l, xr, b, b + width / BLOCK, n, first, last, gate, s->is_bf16);
                block_of(l, xr, b + width / BLOCK, b + 1, n, first, last, up, s->is_bf16);
                if (s->is_bf16)
                    silu_block(gate, up, act, r, n, width, b, first, last, vectorized, 1);
                else
                    silu_block(gate, up, act, r, n, width, b, first, last, vectorized, 0);
            }
        }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
/* gate_up_silu on AMX's tiles (bfloat16): a thread computes a block of 32 of gate's outputs and the
 * same block of up's (amx_gemv.c: tile_block_outputs, each rounded to bfloat16 as amx_gemv rounds
 * it) and writes silu(gate) * up at once (silu_block), as silu_and_mul would from the same numbers:
 * the same bits, without writing gate_up out and reading it back in a pass of its own. Up to 32
 * rows. AMX block b is outputs [first, first + 32) of silu_block's block of 64, b / 2. */
static void amx_gate_up_silu(const linear_t *l, const void *x, void *act, const step_t *s) {
    const int64_t width = l->out / 2, half = width / AMX_BLOCK, rows = s->rows;
    const int64_t vectorized = silu_vectorized(width, s->silu_run);
    const int64_t rows0 = rows < GROUP ? rows : GROUP, rows1 = rows - rows0;
    const uint16_t *weight = l->weight, *bias = l->bias;
    _Static_assert(BLOCK == 2 * AMX_BLOCK, "an AMX block is half of silu_block's");
#pragma omp parallel num_threads(s->threads)
    {
        _Alignas(64) uint16_t gate[2 * GROUP * BLOCK], up[2 * GROUP * BLOCK]; /* [row][BLOCK] */
        configure_tiles(rows0, rows1);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < half; ++b) {
            const int64_t first = b % 2 * AMX_BLOCK, column = b * AMX_BLOCK;
            tile_block_outputs(x, weight + b * l->in * AMX_BLOCK, bias ? bias + column : 0,
                               gate + first, l->in, BLOCK, AMX_BLOCK, rows0, rows1);
            tile_block_outputs(x, weight + (b + half) * l->in * AMX_BLOCK,
                               bias ? bias + width + column : 0, up + first, l->in, BLOCK,
                               AMX_BLOCK, rows0, rows1);
            silu_block((const char *)gate, (const char *)up, act, 0, rows, width, b / 2, first,
                       first + AMX_BLOCK, vectorized, 1);
        }
    }
}
#else /* never called: amx is 0 where the compiler has no AMX (amx_gemv_ready says no) */
static void amx_gate_up_silu(const linear_t *l, const void *x, void *act, const step_t *s) {
    (void)l, (void)x, (void)act, (void)s;
}
#endif

/* residual [rows, hidden]: the embedded tokens in, the last layer's residual stream out. Returns
 * 0; 1 where a buffer could not be allocated, 2 where a block table does not fit. */
int decode_layers(const layer_t *layers, int64_t num_layers, const step_t *s, void *residual) {
    const int64_t rows = s->rows, qkv_width = (s->heads + 2 * s->kv_heads) * s->dim;
    const int64_t attention_width = s->heads * s->dim;
    const int bf16 = s->is_bf16;
    const int64_t size = bf16 ? 2 : 4; /* bytes a number */
    char *h = malloc(rows * (2 * s->hidden + qkv_width + attention_width + 3 * s->intermediate) *
                     size);
    if (h == NULL) return 1;
    char *qkv = h + rows * s->hidden * size, *o = qkv + rows * qkv_width * size;
    char *out = o + rows * attention_width * size, *gate_up = out + rows * s->hidden * size;
    char *act = gate_up + rows * 2 * s->intermediate * size;
    const fresh_t fresh = {qkv, s->cos, s->sin, s->positions, s->slot_mapping};
    int failed = add_rms_norm(NULL, residual, layers[0].input_norm, h, rows, s->hidden,
                              layers[0].input_eps, bf16, s->threads);
    for (int64_t i = 0; i < num_layers && !failed; ++i) {
        const layer_t *l = &layers[i];
        linear(&l->qkv, h, qkv, s);
        failed |= decode_attention(NULL, l->k_cache, l->v_cache, o, s->block_tables, s->seq_lens,
                                   rows, s->heads, s->kv_heads, s->dim, s->num_blocks,
                                   s->block_size, s->max_blocks, s->scale, bf16, s->kv_bf16,
                                   s->threads, 1, &fresh);
        linear(&l->o, o, out, s);
        failed |= add_rms_norm(out, residual, l->post_attention_norm, h, rows, s->hidden,
                               l->post_attention_eps, bf16, s->threads);
        if (on_amx(s) && s->intermediate % AMX_BLOCK == 0) {
            amx_gate_up_silu(&l->gate_up, h, act, s);
        } else if (!on_amx(s) && s->intermediate % BLOCK == 0) {
            gate_up_silu(&l->gate_up, h, act, s);
        } else {
            linear(&l->gate_up, h, gate_up, s);
            silu_and_mul(gate_up, act, rows, s->intermediate, s->silu_run, bf16, s->threads);
        }
        linear(&l->down, act, out, s);
        if (i + 1 < num_layers)
            failed |= add_rms_norm(out, residual, l[1].input_norm, h, rows, s->hidden,
                                   l[1].input_eps, bf16, s->threads);
        else
            for (int64_t e = 0; e < rows * s->hidden; ++e) /* residual += out, rounded as torch's */
                put(residual, e, get(residual, e, bf16) + get(out, e, bf16), bf16);
    }
    free(h);
    return failed;
}
