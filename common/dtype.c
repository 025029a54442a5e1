/* dtype.c — f32 <-> f16 / bf16 conversions and array casts (see dtype.h).
 *
 * DESIGN: every conversion works on the bit patterns with integer arithmetic only, so the
 * result does not depend on the FPU rounding mode, flush-to-zero settings or whether the
 * compiler has a native half type: the same input gives the same bits on every machine.
 * Rounding to nearest-even is done by adding (half an ulp - 1) plus the lowest kept bit
 * before truncating; a carry out of the mantissa correctly bumps the exponent (and turns
 * the largest finite value into infinity when the input is past the overflow threshold).
 * NaNs keep their sign and the top bits of their payload and always come out quiet.
 * Widening (f16 -> f32, bf16 -> f32) is exact. f16 <-> bf16 goes through f32: widening is
 * exact, so the result is rounded once. */
#include "common/dtype.h"

#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

size_t pst_dtype_size(pst_dtype t)
{
    switch (t) {
    case PST_F32: return 4;
    case PST_F16: return 2;
    case PST_BF16: return 2;
    default: return 0;
    }
}

const char *pst_dtype_name(pst_dtype t)
{
    switch (t) {
    case PST_F32: return "f32";
    case PST_F16: return "f16";
    case PST_BF16: return "bf16";
    default: return "unknown";
    }
}

int pst_dtype_parse(const char *s, pst_dtype *out)
{
    static const struct {
        const char *name;
        pst_dtype type;
    } names[] = {
        {"f32", PST_F32},  {"fp32", PST_F32},      {"float32", PST_F32},
        {"f16", PST_F16},  {"fp16", PST_F16},      {"float16", PST_F16},
        {"bf16", PST_BF16}, {"bfloat16", PST_BF16},
    };
    if (!s || !out)
        return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].type;
            return 0;
        }
    }
    return -1;
}

uint16_t pst_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u)
            return sign | 0x7c00u; /* infinity */
        /* NaN: quiet bit set, top 9 payload bits kept, so it can never become infinity. */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x03ffu));
    }
    /* 65520 = 65504 + half an ulp: ties go to the even neighbour, which is infinity. */
    if (ax >= 0x477ff000u)
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {
        /* Normal f16 (|f| >= 2^-14): rebias the exponent from 127 to 15, round 13 bits. */
        uint32_t m = ax - ((uint32_t)(127 - 15) << 23);
        m += 0x0fffu + ((m >> 13) & 1u);
        return (uint16_t)(sign | (m >> 13));
    }
    /* Below 2^-14: an f16 subnormal counts units of 2^-24. Half a unit (2^-25) and less
     * rounds to zero (exactly half is a tie with the even zero). */
    if (ax <= 0x33000000u)
        return sign;
    uint32_t e = ax >> 23;                         /* 102 .. 112 here */
    uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
    uint32_t shift = 126 - e;                      /* 14 .. 24 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may reach 0x400, the smallest normal: the bit pattern is still right */
    return (uint16_t)(sign | q);
}

float pst_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x03ffu;

    if (exp == 0x1fu) {
        if (mant == 0)
            return f32_from_bits(sign | 0x7f800000u);
        return f32_from_bits(sign | 0x7fc00000u | (mant << 13)); /* quiet NaN */
    }
    if (exp == 0) {
        if (mant == 0)
            return f32_from_bits(sign);
        /* Subnormal: mant * 2^-24; shift the leading one up to the implicit position. */
        uint32_t e = 113; /* f32 biased exponent of 2^-14 */
        while (!(mant & 0x0400u)) {
            mant <<= 1;
            e--;
        }
        return f32_from_bits(sign | (e << 23) | ((mant & 0x03ffu) << 13));
    }
    return f32_from_bits(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

uint16_t pst_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN, sign and top payload kept */
    /* Same exponent range as f32: subnormals round like normals and values past the
     * largest bf16 plus half an ulp carry into the infinity pattern. */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float pst_bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    if ((b & 0x7fffu) > 0x7f80u)
        x |= 0x00400000u; /* quiet NaN */
    return f32_from_bits(x);
}

static float load_f32(const void *src, pst_dtype st, size_t i)
{
    uint16_t h;
    switch (st) {
    case PST_F32: {
        float f;
        memcpy(&f, (const char *)src + 4 * i, sizeof f);
        return f;
    }
    case PST_F16:
        memcpy(&h, (const char *)src + 2 * i, sizeof h);
        return pst_f16_to_f32(h);
    default:
        memcpy(&h, (const char *)src + 2 * i, sizeof h);
        return pst_bf16_to_f32(h);
    }
}

static void store_f32(void *dst, pst_dtype dt, size_t i, float f)
{
    uint16_t h;
    switch (dt) {
    case PST_F32:
        memcpy((char *)dst + 4 * i, &f, sizeof f);
        return;
    case PST_F16:
        h = pst_f32_to_f16(f);
        memcpy((char *)dst + 2 * i, &h, sizeof h);
        return;
    default:
        h = pst_f32_to_bf16(f);
        memcpy((char *)dst + 2 * i, &h, sizeof h);
        return;
    }
}

void pst_cast(void *dst, pst_dtype dt, const void *src, pst_dtype st, size_t n)
{
    /* Unknown types: nothing to convert to or from (the function cannot fail). */
    if ((unsigned)dt >= PST_DTYPE_COUNT_ || (unsigned)st >= PST_DTYPE_COUNT_ || n == 0)
        return;
    if (dt == st) {
        if (dst != src)
            memmove(dst, src, n * pst_dtype_size(st));
        return;
    }
    /* The common wire/device cases get their own loops so the type switch is hoisted.
     * Elements go through memcpy, so src and dst need no particular alignment (wire
     * buffers often have none); the compiler turns it into plain loads and stores. */
    const char *s = src;
    char *d = dst;
/* One specialized loop per common pair: load an S from s, convert, store a D to d. */
#define CAST_LOOP(S, D, CONVERT)                                                           \
    for (size_t i = 0; i < n; i++) {                                                       \
        S x;                                                                               \
        memcpy(&x, s + sizeof(S) * i, sizeof(S));                                          \
        D y = CONVERT(x);                                                                  \
        memcpy(d + sizeof(D) * i, &y, sizeof(D));                                          \
    }
    if (st == PST_F32 && dt == PST_F16) {
        CAST_LOOP(float, uint16_t, pst_f32_to_f16);
        return;
    }
    if (st == PST_F16 && dt == PST_F32) {
        CAST_LOOP(uint16_t, float, pst_f16_to_f32);
        return;
    }
    if (st == PST_F32 && dt == PST_BF16) {
        CAST_LOOP(float, uint16_t, pst_f32_to_bf16);
        return;
    }
    if (st == PST_BF16 && dt == PST_F32) {
        CAST_LOOP(uint16_t, float, pst_bf16_to_f32);
        return;
    }
#undef CAST_LOOP
    /* f16 <-> bf16 through an exact f32 intermediate. */
    for (size_t i = 0; i < n; i++)
        store_f32(dst, dt, i, load_f32(src, st, i));
}
