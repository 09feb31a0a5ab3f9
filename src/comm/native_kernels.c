/* The decoders of src/comm/codec.py as plain C loops, for CPUs (src/comm/native.py builds and loads this file).

Inductor's AVX2 code loads every integer vector through a stack copy (a stalled store-to-load forward per
vector), so its decoders, which read packed integer words, run 4-6x slower than a copy; these loops read the words
directly and the C compiler vectorises them for the machine's ISA. Each computes the same integer field sums and
the same float32 operations, in the same order, as the torch code of its namesake in codec.py (no FMA contraction,
no reciprocal: the build flags keep IEEE float semantics), so the results are equal bit for bit. */
#include <stdint.h>
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

/* block_l1: per row of 128 floats, sum |x| in the order torch.sum(x.abs(), dim=1) adds them on CPU (its
   vectorised inner sum with `lanes`-wide vectors: four vector accumulators taking vectors 4i + k in turn, then
   added together, then their lanes in order); src/comm/native.py uses it only where it reproduced torch exactly. */
static inline void block_l1_rows(float *restrict out, const float *restrict x, int64_t rows, const int lanes) {
    const int width = 128, vectors = width / lanes, groups = vectors / 4;
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict row = x + r * width;
        float acc[4][64];
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++) acc[k][l] = 0.0f;
        for (int i = 0; i < groups; i++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < lanes; l++) acc[k][l] += fabsf(row[(4 * i + k) * lanes + l]);
        for (int i = groups * 4; i < vectors; i++)
            for (int l = 0; l < lanes; l++) acc[0][l] += fabsf(row[i * lanes + l]);
        for (int k = 1; k < 4; k++)
            for (int l = 0; l < lanes; l++) acc[0][l] += acc[k][l];
        float total = 0.0f;
        for (int l = 0; l < lanes; l++) total += acc[0][l];
        out[r] = total;
    }
}

void lc_block_l1(float *restrict out, const float *restrict x, int64_t rows, int lanes) {
    switch (lanes) {  /* constant widths: loops the compiler unrolls and vectorises */
        case 4: block_l1_rows(out, x, rows, 4); break;
        case 8: block_l1_rows(out, x, rows, 8); break;
        case 16: block_l1_rows(out, x, rows, 16); break;
        default: block_l1_rows(out, x, rows, 32); break;
    }
}
