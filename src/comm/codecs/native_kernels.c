/* The encoders and decoders of src/comm/codecs/reference.py as plain C loops, for CPUs (src/comm/codecs/native.py
builds and loads this file).

Inductor's AVX2 code loads every integer vector through a stack copy (a stalled store-to-load forward per
vector), so its decoders, which read packed integer words, ran 4-6x slower than a copy, and its L1 encoders 4-5x;
these loops read and write the words directly and the C compiler vectorises them for the machine's ISA. Each
computes the same integers and the same float32 operations, in the same order, as the torch code of its namesake in
reference.py (no FMA contraction, no reciprocal, rintf for torch.round's half-to-even: the build flags keep IEEE
float semantics), so the results are equal bit for bit. The layout is planar (src/comm/codecs/packing.py): value
j m + i of n = k m values is field j of word i. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static inline float sign_of(float d) { return d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f); }

/* One field plane: out[i] = f(((word[i] >> shift) & mask)) for the four variants of decode_sums. */
#define PLANE(TYPE)                                                                                           \
    static void plane_##TYPE(float *restrict out, const TYPE *restrict w, int64_t m, int shift, uint32_t mask, \
                             float offset, int votes, int majority, float divisor) {                          \
        if (votes && majority) {                                                                              \
            for (int64_t i = 0; i < m; i++) out[i] = sign_of(((float)((w[i] >> shift) & mask) - offset) * 2.0f); \
        } else if (votes) {                                                                                   \
            for (int64_t i = 0; i < m; i++) out[i] = ((float)((w[i] >> shift) & mask) - offset) * 2.0f / divisor; \
        } else if (majority) {                                                                                \
            for (int64_t i = 0; i < m; i++) out[i] = sign_of((float)((w[i] >> shift) & mask) - offset);       \
        } else {                                                                                              \
            for (int64_t i = 0; i < m; i++) out[i] = ((float)((w[i] >> shift) & mask) - offset) / divisor;    \
        }                                                                                                     \
    }
PLANE(uint8_t)
PLANE(int32_t)

/* decode_sums: m words of `bits`-wide fields (uint8 words up to 8 bits, int32 for 16) -> k m floats, planar. */
void lc_decode_sums(float *out, const void *words, int64_t m, int bits, float offset, int votes, int majority,
                    float divisor) {
    int k = bits == 16 ? 2 : 8 / bits;
    uint32_t mask = (1u << bits) - 1u;
    for (int j = 0; j < k; j++) {
        if (bits == 16)
            plane_int32_t(out + j * m, (const int32_t *)words, m, bits * j, mask, offset, votes, majority, divisor);
        else
            plane_uint8_t(out + j * m, (const uint8_t *)words, m, bits * j, mask, offset, votes, majority, divisor);
    }
}

/* decode_signs_1bit: +1 where bit j of word i is set, else -1, at out[j m + i]. */
void lc_decode_signs_1bit(float *restrict out, const uint8_t *restrict words, int64_t m) {
    for (int j = 0; j < 8; j++) {
        float *restrict plane = out + j * m;
        for (int64_t i = 0; i < m; i++) plane[i] = (words[i] >> j) & 1 ? 1.0f : -1.0f;
    }
}

/* majority_1bit: per bit of the m words, set where the ones among world_size copies reach the threshold
   (ones >= ceil(W / 2) with ties to +1, ones > W / 2 otherwise): the same bit-sliced count as codec.py, a tile of
   words at a time. */
#define TILE 4096
void lc_majority_1bit(uint8_t *restrict out, const uint8_t *restrict received, int64_t m, int world_size,
                      int positive) {
    int width = 0;
    while ((world_size >> width) > 0) width++;
    int threshold = positive ? (world_size + 1) / 2 : world_size / 2 + 1;
    uint8_t count[32][TILE];
    for (int64_t start = 0; start < m; start += TILE) {
        int64_t n = m - start < TILE ? m - start : TILE;
        for (int j = 0; j < width; j++) memset(count[j], 0, (size_t)n);
        for (int w = 0; w < world_size; w++) {
            const uint8_t *restrict plane = received + (int64_t)w * m + start;
            uint8_t carry[TILE];
            memcpy(carry, plane, (size_t)n);
            for (int j = 0; j < width; j++) {
                uint8_t *restrict c = count[j];
                for (int64_t i = 0; i < n; i++) {
                    uint8_t sum = c[i] ^ carry[i];
                    carry[i] = c[i] & carry[i];
                    c[i] = sum;
                }
            }
        }
        uint8_t greater[TILE], equal[TILE];
        memset(greater, 0, (size_t)n);
        memset(equal, 255, (size_t)n);
        for (int j = width - 1; j >= 0; j--) {
            const uint8_t *restrict c = count[j];
            if ((threshold >> j) & 1) {
                for (int64_t i = 0; i < n; i++) equal[i] &= c[i];
            } else {
                for (int64_t i = 0; i < n; i++) {
                    greater[i] |= equal[i] & c[i];
                    equal[i] &= (uint8_t)~c[i];
                }
            }
        }
        for (int64_t i = 0; i < n; i++) out[start + i] = greater[i] | equal[i];
    }
}

/* block_l1: per row of 128 floats, sum |x| added as src/quant/blocks.py `fold_sum` adds it: the first half plus
   the second half, again and again (64 sums of 2, 32 of 4, ... 1 of 128); every addition is one rounding in a fixed
   order, so the result is the same bits as the torch reference and the Triton kernel's on any machine. */
void lc_block_l1(float *restrict out, const float *restrict x, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {  /* one stage per width: loops of constant length the compiler vectorises */
        const float *restrict row = x + r * 128;
        float a[64], b[32], c[16], d[8], e[4], f[2];
        for (int i = 0; i < 64; i++) a[i] = fabsf(row[i]) + fabsf(row[i + 64]);
        for (int i = 0; i < 32; i++) b[i] = a[i] + a[i + 32];
        for (int i = 0; i < 16; i++) c[i] = b[i] + b[i + 16];
        for (int i = 0; i < 8; i++) d[i] = c[i] + c[i + 8];
        for (int i = 0; i < 4; i++) e[i] = d[i] + d[i + 4];
        for (int i = 0; i < 2; i++) f[i] = e[i] + e[i + 2];
        out[r] = f[0] + f[1];
    }
}


/* encode_votes: field j of word i is 1 where x[j m + i] votes +1 (x > 0, or x >= 0 with ties to +1; NaN: 0). */
#define VOTES(K, BITS, WORD)                                                                                  \
    static void votes_##BITS(WORD *restrict out, const float *restrict x, int64_t m, int positive) {         \
        if (positive) {                                                                                       \
            for (int64_t i = 0; i < m; i++) {                                                                 \
                uint32_t w = 0;                                                                               \
                for (int j = 0; j < K; j++) w |= (uint32_t)(x[j * m + i] >= 0.0f) << (BITS * j);              \
                out[i] = (WORD)w;                                                                             \
            }                                                                                                 \
        } else {                                                                                              \
            for (int64_t i = 0; i < m; i++) {                                                                 \
                uint32_t w = 0;                                                                               \
                for (int j = 0; j < K; j++) w |= (uint32_t)(x[j * m + i] > 0.0f) << (BITS * j);               \
                out[i] = (WORD)w;                                                                             \
            }                                                                                                 \
        }                                                                                                     \
    }
VOTES(8, 1, uint8_t)
VOTES(4, 2, uint8_t)
VOTES(2, 4, uint8_t)
VOTES(1, 8, uint8_t)
VOTES(2, 16, int32_t)

void lc_encode_votes(void *out, const float *x, int64_t m, int bits, int positive) {
    switch (bits) {
        case 1: votes_1((uint8_t *)out, x, m, positive); break;
        case 2: votes_2((uint8_t *)out, x, m, positive); break;
        case 4: votes_4((uint8_t *)out, x, m, positive); break;
        case 8: votes_8((uint8_t *)out, x, m, positive); break;
        default: votes_16((int32_t *)out, x, m, positive); break;
    }
}

/* encode_signs: field j of word i is sign(x) + 1 in {0, 1, 2} of x[j m + i] (NaN: 1); fields of 2 bits or more. */
#define SIGNS(K, BITS, WORD)                                                                                  \
    static void signs_##BITS(WORD *restrict out, const float *restrict x, int64_t m) {                       \
        for (int64_t i = 0; i < m; i++) {                                                                     \
            uint32_t w = 0;                                                                                   \
            for (int j = 0; j < K; j++) {                                                                     \
                float v = x[j * m + i];                                                                       \
                w |= (uint32_t)(1 + (v > 0.0f) - (v < 0.0f)) << (BITS * j);                                   \
            }                                                                                                 \
            out[i] = (WORD)w;                                                                                 \
        }                                                                                                     \
    }
SIGNS(4, 2, uint8_t)
SIGNS(2, 4, uint8_t)
SIGNS(1, 8, uint8_t)
SIGNS(2, 16, int32_t)

void lc_encode_signs(void *out, const float *x, int64_t m, int bits) {
    switch (bits) {
        case 2: signs_2((uint8_t *)out, x, m); break;
        case 4: signs_4((uint8_t *)out, x, m); break;
        case 8: signs_8((uint8_t *)out, x, m); break;
        default: signs_16((int32_t *)out, x, m); break;
    }
}

/* The code of one value shifted to [0, 2L], as src.quant.blocks.quantize_blocks gives it plus `levels`:
   l1: clamp(round(x inv), -L, L) (round half to even: rintf in the default rounding mode);
   linf: q = floor(y), q + (u < y - q), clamped; linf_nozero: then sign(x) where q == 0 and x != 0;
   a NaN code (NaN input, or inf * 0) is 0. Clamping is done on floats first, so the integer cast is exact. */
static inline float clamp_levels(float q, float L) { return q < -L ? -L : (q > L ? L : q); }

static inline uint32_t code_l1(float x, float inv, float L) {
    float q = clamp_levels(rintf(x * inv), L);
    return (uint32_t)(int32_t)((q != q ? 0.0f : q) + L);
}

static inline uint32_t code_linf(float x, float inv, float u, float L, int nozero) {
    float y = x * inv;
    float q = floorf(y);
    float fraction = y - q;
    q = clamp_levels(q + (u < fraction ? 1.0f : 0.0f), L);
    if (nozero && q == 0.0f && x != 0.0f) q = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
    return (uint32_t)(int32_t)((q != q ? 0.0f : q) + L);
}

/* encode_levels: n = k m values, block b of 128 values read from table[b] and scaled by inverse[b]; method 0: l1,
   1: linf, 2: linf_nozero. m is a multiple of 128, so a tile of 128 words takes its k fields from k whole blocks. */
#define LEVELS(K, BITS, WORD)                                                                                 \
    static void levels_##BITS(WORD *restrict out, const float *const *table, const float *restrict inverse,  \
                              const float *restrict noise, int64_t m, int method, float L) {                 \
        const int64_t rows = m / 128;                                                                         \
        for (int64_t r = 0; r < rows; r++) {                                                                  \
            WORD *restrict o = out + r * 128;                                                                 \
            uint32_t w[128];                                                                                  \
            for (int l = 0; l < 128; l++) w[l] = 0;                                                           \
            for (int j = 0; j < K; j++) {                                                                     \
                const float *restrict b = table[j * rows + r];                                                \
                const float inv = inverse[j * rows + r];                                                      \
                if (method == 0) {                                                                            \
                    for (int l = 0; l < 128; l++) w[l] |= code_l1(b[l], inv, L) << (BITS * j);                \
                } else {                                                                                      \
                    const float *restrict u = noise + j * m + r * 128;                                        \
                    if (method == 1)                                                                          \
                        for (int l = 0; l < 128; l++) w[l] |= code_linf(b[l], inv, u[l], L, 0) << (BITS * j); \
                    else                                                                                      \
                        for (int l = 0; l < 128; l++) w[l] |= code_linf(b[l], inv, u[l], L, 1) << (BITS * j); \
                }                                                                                             \
            }                                                                                                 \
            for (int l = 0; l < 128; l++) o[l] = (WORD)w[l];                                                  \
        }                                                                                                     \
    }
LEVELS(4, 2, uint8_t)
LEVELS(2, 4, uint8_t)
LEVELS(2, 16, int32_t)

/* One field per word (8 bits): the codes are the words. */
static void levels_8(uint8_t *restrict out, const float *const *table, const float *restrict inverse,
                     const float *restrict noise, int64_t m, int method, float L) {
    for (int64_t r = 0; r < m / 128; r++) {
        const float *restrict b = table[r];
        uint8_t *restrict o = out + r * 128;
        const float inv = inverse[r];
        if (method == 0) {
            for (int l = 0; l < 128; l++) o[l] = (uint8_t)code_l1(b[l], inv, L);
        } else {
            const float *restrict u = noise + r * 128;
            if (method == 1)
                for (int l = 0; l < 128; l++) o[l] = (uint8_t)code_linf(b[l], inv, u[l], L, 0);
            else
                for (int l = 0; l < 128; l++) o[l] = (uint8_t)code_linf(b[l], inv, u[l], L, 1);
        }
    }
}

static const float ZEROS[128];

/* encode_levels of a chunk of n = k m values given as pieces: piece p's lens[p] values start at values[p] and sit
   at offset ats[p] (a multiple of 128) of the chunk; what no piece covers is zero (the padding of the layout),
   as is the rest of a piece's last, partial block. Returns 0 where memory for the block table runs out. */
int lc_encode_levels(void *out, const float *const *values, const int64_t *ats, const int64_t *lens, int pieces,
                     const float *inverse, const float *noise, int64_t m, int bits, int method, int levels) {
    const int64_t blocks = (bits == 16 ? 2 : 8 / bits) * m / 128;
    const float **table = malloc((size_t)(blocks > 0 ? blocks : 1) * sizeof *table);
    float *partial = calloc((size_t)(pieces > 0 ? pieces : 1) * 128, sizeof *partial);
    if (table == NULL || partial == NULL) {
        free(table);
        free(partial);
        return 0;
    }
    for (int64_t b = 0; b < blocks; b++) table[b] = ZEROS;
    for (int p = 0; p < pieces; p++) {
        const int64_t first = ats[p] / 128, whole = lens[p] / 128, rest = lens[p] % 128;
        for (int64_t i = 0; i < whole; i++) table[first + i] = values[p] + i * 128;
        if (rest) {
            memcpy(partial + p * 128, values[p] + whole * 128, (size_t)rest * sizeof *partial);
            table[first + whole] = partial + p * 128;
        }
    }
    const float L = (float)levels;
    switch (bits) {
        case 2: levels_2((uint8_t *)out, table, inverse, noise, m, method, L); break;
        case 4: levels_4((uint8_t *)out, table, inverse, noise, m, method, L); break;
        case 8: levels_8((uint8_t *)out, table, inverse, noise, m, method, L); break;
        default: levels_16((int32_t *)out, table, inverse, noise, m, method, L); break;
    }
    free(table);
    free(partial);
    return 1;
}
