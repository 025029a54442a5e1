/* test_dtype.c — f32 <-> f16 / bf16 conversions and pst_cast (common/dtype.c).
 *
 * The conversions are checked three ways: hand-picked edge cases with their known bit
 * patterns (signed zeros, infinities, NaNs, the normal/subnormal limits, ties, overflow),
 * exhaustive sweeps over all 65536 half-precision patterns (round trips, exact widening,
 * every midpoint between neighbours), and a reference rounding written with double
 * arithmetic and nearbyint() compared on millions of f32 inputs. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "common/rng.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
}

static int bf16_is_nan(uint16_t b)
{
    return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
}

/* The exact value of a finite f16 pattern, computed independently of dtype.c. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    int m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Reference f32 -> f16 on doubles: scale so one f16 ulp is 1, then nearbyint() (round to
 * nearest, ties to even in the default mode); all steps are exact in double. */
static uint16_t ref_f16(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f))
        return 0; /* not used for NaN */
    double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    if (a < ldexp(1.0, -14))
        return sign | (uint16_t)nearbyint(ldexp(a, 24)); /* 1024 is the smallest normal */
    int k;
    frexp(a, &k);
    int e = k - 1; /* a = s * 2^e, 1 <= s < 2 */
    double r = nearbyint(ldexp(a, 10 - e));
    if (r == 2048.0) {
        r = 1024.0;
        e++;
    }
    return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(r - 1024.0);
}

/* Reference f32 -> bf16, same method with an 8-bit significand and f32's exponent range. */
static uint16_t ref_bf16(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(f))
        return sign | 0x7f80;
    if (a < ldexp(1.0, -126))
        return sign | (uint16_t)nearbyint(ldexp(a, 133)); /* 128 is the smallest normal */
    int k;
    frexp(a, &k);
    int e = k - 1;
    double r = nearbyint(ldexp(a, 7 - e));
    if (r == 256.0) {
        r = 128.0;
        e++;
    }
    if (e > 127)
        return sign | 0x7f80;
    return sign | (uint16_t)((e + 127) << 7) | (uint16_t)(r - 128.0);
}

#define EXPECT_F16(f, want)                                                             \
    do {                                                                                \
        uint16_t got_ = pst_f32_to_f16(f);                                              \
        cr_expect_eq(got_, (uint16_t)(want), "f32_to_f16(%a) = 0x%04x, want 0x%04x",    \
                     (double)(f), got_, (unsigned)(want));                              \
    } while (0)

#define EXPECT_BF16(f, want)                                                            \
    do {                                                                                \
        uint16_t got_ = pst_f32_to_bf16(f);                                             \
        cr_expect_eq(got_, (uint16_t)(want), "f32_to_bf16(%a) = 0x%04x, want 0x%04x",   \
                     (double)(f), got_, (unsigned)(want));                              \
    } while (0)

#define EXPECT_F32_BITS(f, want)                                                        \
    do {                                                                                \
        uint32_t got_ = bits(f);                                                        \
        cr_expect_eq(got_, (uint32_t)(want), "got f32 0x%08x, want 0x%08x", got_,       \
                     (unsigned)(want));                                                 \
    } while (0)

Test(dtype, size_name_parse)
{
    cr_assert_eq(pst_dtype_size(PST_F32), 4);
    cr_assert_eq(pst_dtype_size(PST_F16), 2);
    cr_assert_eq(pst_dtype_size(PST_BF16), 2);
    cr_assert_eq(pst_dtype_size(PST_DTYPE_COUNT_), 0);
    cr_assert_str_eq(pst_dtype_name(PST_F32), "f32");
    cr_assert_str_eq(pst_dtype_name(PST_F16), "f16");
    cr_assert_str_eq(pst_dtype_name(PST_BF16), "bf16");
    cr_assert_str_eq(pst_dtype_name(PST_DTYPE_COUNT_), "unknown");

    static const struct {
        const char *s;
        pst_dtype t;
    } ok[] = {{"f32", PST_F32},  {"fp32", PST_F32},     {"float32", PST_F32},
              {"f16", PST_F16},  {"fp16", PST_F16},     {"float16", PST_F16},
              {"bf16", PST_BF16}, {"bfloat16", PST_BF16}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pst_dtype t = PST_DTYPE_COUNT_;
        cr_assert_eq(pst_dtype_parse(ok[i].s, &t), 0, "%s", ok[i].s);
        cr_assert_eq(t, ok[i].t, "%s", ok[i].s);
        cr_assert_str_eq(pst_dtype_name(t), ok[i].s[0] == 'b' ? "bf16"
                                            : t == PST_F32    ? "f32"
                                                              : "f16");
    }
    static const char *const bad[] = {"", "f64", "half", "bf32", "f16 ", "fp", "bfloat"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pst_dtype t = PST_F16;
        cr_assert_eq(pst_dtype_parse(bad[i], &t), -1, "'%s'", bad[i]);
        cr_assert_eq(t, PST_F16, "output untouched on failure");
    }
    pst_dtype t;
    cr_assert_eq(pst_dtype_parse(NULL, &t), -1);
    cr_assert_eq(pst_dtype_parse("f32", NULL), -1);
}

Test(f16, zeros_and_infinities)
{
    EXPECT_F16(0.0f, 0x0000);
    EXPECT_F16(-0.0f, 0x8000);
    EXPECT_F16(INFINITY, 0x7c00);
    EXPECT_F16(-INFINITY, 0xfc00);
    EXPECT_F32_BITS(pst_f16_to_f32(0x0000), 0x00000000);
    EXPECT_F32_BITS(pst_f16_to_f32(0x8000), 0x80000000);
    EXPECT_F32_BITS(pst_f16_to_f32(0x7c00), 0x7f800000);
    EXPECT_F32_BITS(pst_f16_to_f32(0xfc00), 0xff800000);
}

Test(f16, nan)
{
    /* Quiet and signalling f32 NaNs of both signs, including payloads that live only in
     * the low 13 bits (which truncation alone would turn into infinity). */
    static const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,
                                    0x7fbfffff, 0x7f802000, 0x7fffffff, 0xffffffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = pst_f32_to_f16(from_bits(nans[i]));
        cr_expect(f16_is_nan(h), "0x%08x -> 0x%04x is not NaN", nans[i], h);
        cr_expect(h & 0x0200, "0x%08x -> 0x%04x is not quiet", nans[i], h);
        cr_expect_eq(h >> 15, nans[i] >> 31, "0x%08x -> 0x%04x lost the sign", nans[i], h);
    }
    EXPECT_F16(from_bits(0x7fc00000), 0x7e00);
    EXPECT_F16(from_bits(0xffc00000), 0xfe00);
    /* f16 NaNs widen to quiet f32 NaNs with the sign and payload. */
    EXPECT_F32_BITS(pst_f16_to_f32(0x7e00), 0x7fc00000);
    EXPECT_F32_BITS(pst_f16_to_f32(0xfe00), 0xffc00000);
    EXPECT_F32_BITS(pst_f16_to_f32(0x7c01), 0x7fc02000); /* signalling -> quiet */
    EXPECT_F32_BITS(pst_f16_to_f32(0x7fff), 0x7fffe000);
    cr_expect(isnan(pst_f16_to_f32(0xfc01)) && signbit(pst_f16_to_f32(0xfc01)));
}

Test(f16, normal_and_subnormal_limits)
{
    /* Largest finite, smallest normal, largest and smallest subnormal, and 1. */
    EXPECT_F16(65504.0f, 0x7bff);
    EXPECT_F16(-65504.0f, 0xfbff);
    EXPECT_F16(0x1p-14f, 0x0400);
    EXPECT_F16(0x3ffp-24f, 0x03ff);
    EXPECT_F16(0x1p-24f, 0x0001);
    EXPECT_F16(-0x1p-24f, 0x8001);
    EXPECT_F16(1.0f, 0x3c00);
    EXPECT_F16(-2.0f, 0xc000);
    EXPECT_F16(0.333251953125f, 0x3555); /* nearest f16 to 1/3, exactly representable */
    cr_expect_eq(pst_f16_to_f32(0x7bff), 65504.0f);
    cr_expect_eq(pst_f16_to_f32(0x0400), 0x1p-14f);
    cr_expect_eq(pst_f16_to_f32(0x03ff), 0x3ffp-24f);
    cr_expect_eq(pst_f16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(pst_f16_to_f32(0x8001), -0x1p-24f);
    cr_expect_eq(pst_f16_to_f32(0x3c00), 1.0f);
    cr_expect_eq(pst_f16_to_f32(0x3555), 0.333251953125f);
}

Test(f16, ties_and_neighbours)
{
    /* Halfway between 0x3c00 (1, even) and 0x3c01 (odd): down to the even one. */
    float t_even = 1.0f + 0x1p-11f;
    EXPECT_F16(t_even, 0x3c00);
    EXPECT_F16(nextafterf(t_even, 2.0f), 0x3c01);
    EXPECT_F16(nextafterf(t_even, 0.0f), 0x3c00);
    EXPECT_F16(-t_even, 0xbc00);
    /* Halfway between 0x3c01 (odd) and 0x3c02 (even): up to the even one. */
    float t_odd = 1.0f + 3 * 0x1p-11f;
    EXPECT_F16(t_odd, 0x3c02);
    EXPECT_F16(nextafterf(t_odd, 2.0f), 0x3c02);
    EXPECT_F16(nextafterf(t_odd, 0.0f), 0x3c01);
    EXPECT_F16(-t_odd, 0xbc02);
    /* A carry out of the mantissa moves to the next binade: 2 - 2^-11 is halfway between
     * 0x3fff (2 - 2^-10, odd) and 2.0 = 0x4000. */
    EXPECT_F16(2.0f - 0x1p-11f, 0x4000);
    EXPECT_F16(nextafterf(2.0f - 0x1p-11f, 0.0f), 0x3fff);
    /* Subnormal ties: 2^-25 is halfway between 0 (even) and 0x0001: down to zero. */
    EXPECT_F16(0x1p-25f, 0x0000);
    EXPECT_F16(-0x1p-25f, 0x8000);
    EXPECT_F16(nextafterf(0x1p-25f, 1.0f), 0x0001);
    EXPECT_F16(3 * 0x1p-25f, 0x0002); /* between 0x0001 (odd) and 0x0002 */
    EXPECT_F16(5 * 0x1p-25f, 0x0002); /* between 0x0002 (even) and 0x0003 */
    EXPECT_F16(nextafterf(5 * 0x1p-25f, 1.0f), 0x0003);
    EXPECT_F16(nextafterf(3 * 0x1p-25f, 0.0f), 0x0001);
    /* Largest subnormal 0x03ff (odd) to smallest normal 0x0400: the tie goes up. */
    EXPECT_F16(0x7ffp-25f, 0x0400);
    EXPECT_F16(nextafterf(0x7ffp-25f, 0.0f), 0x03ff);
}

Test(f16, overflow_and_underflow)
{
    /* 65520 is halfway between 65504 (0x7bff, odd) and the next step 65536 (infinity). */
    EXPECT_F16(65520.0f, 0x7c00);
    EXPECT_F16(-65520.0f, 0xfc00);
    EXPECT_F16(nextafterf(65520.0f, 0.0f), 0x7bff);
    EXPECT_F16(nextafterf(-65520.0f, 0.0f), 0xfbff);
    EXPECT_F16(65505.0f, 0x7bff);
    EXPECT_F16(65536.0f, 0x7c00);
    EXPECT_F16(1e10f, 0x7c00);
    EXPECT_F16(FLT_MAX, 0x7c00);
    EXPECT_F16(-FLT_MAX, 0xfc00);
    /* Underflow: below half the smallest subnormal is a signed zero. */
    EXPECT_F16(0x1p-26f, 0x0000);
    EXPECT_F16(1e-10f, 0x0000);
    EXPECT_F16(-1e-10f, 0x8000);
    EXPECT_F16(FLT_MIN, 0x0000);
    EXPECT_F16(FLT_TRUE_MIN, 0x0000);
    EXPECT_F16(-FLT_TRUE_MIN, 0x8000);
}

Test(f16, exhaustive_widen_and_round_trip)
{
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = pst_f16_to_f32(h);
        uint16_t back = pst_f32_to_f16(f);
        if (f16_is_nan(h)) {
            /* NaN stays NaN with its sign and payload; only the quiet bit may be added. */
            if (!isnan(f) || back != (h | 0x0200)) {
                cr_expect_fail("NaN 0x%04x -> %a -> 0x%04x", h, (double)f, back);
                bad++;
            }
            continue;
        }
        int exact = (h & 0x7c00) == 0x7c00 ? isinf(f) && !signbit(f) == !(h & 0x8000)
                                           : (double)f == f16_value(h) &&
                                                 !signbit(f) == !(h & 0x8000);
        if (!exact || back != h) {
            cr_expect_fail("0x%04x -> %a -> 0x%04x", h, (double)f, back);
            bad++;
        }
        if (bad > 10)
            break;
    }
    cr_assert_eq(bad, 0);
}

Test(f16, exhaustive_midpoints)
{
    /* For each pair of neighbouring finite f16 values a < b of one sign: the midpoint
     * (exact in f32) goes to whichever has an even pattern, one f32 ulp below it to a and
     * one above to b. This pins every rounding boundary of the format. */
    int bad = 0;
    for (uint32_t s = 0; s < 2; s++) {
        for (uint32_t m = 0; m < 0x7bff && bad < 10; m++) {
            uint16_t lo = (uint16_t)(m | (s << 15)), hi = (uint16_t)((m + 1) | (s << 15));
            float a = pst_f16_to_f32(lo), b = pst_f16_to_f32(hi);
            float mid = (a + b) / 2;
            uint16_t even = (lo & 1) ? hi : lo;
            if (pst_f32_to_f16(mid) != even || pst_f32_to_f16(nextafterf(mid, a)) != lo ||
                pst_f32_to_f16(nextafterf(mid, b)) != hi) {
                cr_expect_fail("midpoint of 0x%04x and 0x%04x (%a): 0x%04x 0x%04x 0x%04x",
                               lo, hi, (double)mid, pst_f32_to_f16(nextafterf(mid, a)),
                               pst_f32_to_f16(mid), pst_f32_to_f16(nextafterf(mid, b)));
                bad++;
            }
        }
    }
    cr_assert_eq(bad, 0);
}

/* Compares pst_f32_to_f16 / pst_f32_to_bf16 with the double references on one input. */
static int check_against_reference(uint32_t u)
{
    float f = from_bits(u);
    if (isnan(f))
        return 1;
    uint16_t h = pst_f32_to_f16(f), rh = ref_f16(f);
    uint16_t b = pst_f32_to_bf16(f), rb = ref_bf16(f);
    if (h != rh)
        cr_expect_fail("f16: 0x%08x (%a) -> 0x%04x, reference 0x%04x", u, (double)f, h, rh);
    if (b != rb)
        cr_expect_fail("bf16: 0x%08x (%a) -> 0x%04x, reference 0x%04x", u, (double)f, b, rb);
    return h == rh && b == rb;
}

Test(f16, matches_double_reference)
{
    int bad = 0;
    /* A stride through all 2^32 f32 patterns (odd stride, so every exponent and many
     * low-bit patterns are hit) ... */
    for (uint64_t u = 0; u < (1ull << 32) && bad < 10; u += 1021)
        bad += !check_against_reference((uint32_t)u);
    /* ... random patterns ... */
    pst_rng r;
    pst_rng_seed(&r, 42, 7);
    for (int i = 0; i < 1000000 && bad < 10; i++)
        bad += !check_against_reference((uint32_t)pst_rng_u64(&r));
    /* ... and random values inside the f16 range, where the rounding work happens. */
    for (int i = 0; i < 2000000 && bad < 10; i++) {
        uint32_t u = (uint32_t)pst_rng_u64(&r);
        uint32_t e = 100 + (uint32_t)pst_rng_below(&r, 44); /* 2^-27 .. 2^16 */
        bad += !check_against_reference((u & 0x807fffffu) | (e << 23));
    }
    cr_assert_eq(bad, 0);
}

Test(bf16, specials)
{
    EXPECT_BF16(0.0f, 0x0000);
    EXPECT_BF16(-0.0f, 0x8000);
    EXPECT_BF16(1.0f, 0x3f80);
    EXPECT_BF16(-2.0f, 0xc000);
    EXPECT_BF16(INFINITY, 0x7f80);
    EXPECT_BF16(-INFINITY, 0xff80);
    EXPECT_BF16(from_bits(0x7fc00000), 0x7fc0);
    EXPECT_BF16(from_bits(0xffc00000), 0xffc0);
    /* Payload only in the low 16 bits: must stay NaN, not become infinity. */
    static const uint32_t nans[] = {0x7f800001, 0xff800001, 0x7f80ffff, 0x7fffffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t b = pst_f32_to_bf16(from_bits(nans[i]));
        cr_expect(bf16_is_nan(b) && (b & 0x0040), "0x%08x -> 0x%04x", nans[i], b);
        cr_expect_eq(b >> 15, nans[i] >> 31);
    }
    EXPECT_F32_BITS(pst_bf16_to_f32(0x3f80), 0x3f800000);
    EXPECT_F32_BITS(pst_bf16_to_f32(0x8000), 0x80000000);
    EXPECT_F32_BITS(pst_bf16_to_f32(0xff80), 0xff800000);
    EXPECT_F32_BITS(pst_bf16_to_f32(0x7f81), 0x7fc10000); /* signalling -> quiet */
    EXPECT_F32_BITS(pst_bf16_to_f32(0xffc0), 0xffc00000);
    EXPECT_F32_BITS(pst_bf16_to_f32(0x0001), 0x00010000); /* smallest subnormal, exact */
}

Test(bf16, ties_overflow_subnormals)
{
    /* 1 + 2^-8 is halfway between 0x3f80 (even) and 0x3f81: down. */
    EXPECT_BF16(1.0f + 0x1p-8f, 0x3f80);
    EXPECT_BF16(nextafterf(1.0f + 0x1p-8f, 2.0f), 0x3f81);
    EXPECT_BF16(nextafterf(1.0f + 0x1p-8f, 0.0f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 0x3f81 (odd) and 0x3f82: up. */
    EXPECT_BF16(1.0f + 3 * 0x1p-8f, 0x3f82);
    EXPECT_BF16(nextafterf(1.0f + 3 * 0x1p-8f, 0.0f), 0x3f81);
    EXPECT_BF16(-(1.0f + 3 * 0x1p-8f), 0xbf82);
    /* Largest finite bf16 0x7f7f (odd): its upper tie and FLT_MAX round to infinity. */
    EXPECT_BF16(from_bits(0x7f7f0000), 0x7f7f);
    EXPECT_BF16(from_bits(0x7f7f7fff), 0x7f7f);
    EXPECT_BF16(from_bits(0x7f7f8000), 0x7f80);
    EXPECT_BF16(FLT_MAX, 0x7f80);
    EXPECT_BF16(-FLT_MAX, 0xff80);
    /* f32 subnormals round like everything else. */
    EXPECT_BF16(from_bits(0x00000001), 0x0000);
    EXPECT_BF16(from_bits(0x00008000), 0x0000); /* tie, even zero */
    EXPECT_BF16(from_bits(0x00008001), 0x0001);
    EXPECT_BF16(from_bits(0x00018000), 0x0002); /* tie, odd 1 -> 2 */
    EXPECT_BF16(from_bits(0x807fffff), 0x8080); /* carries into the smallest normal */
}

Test(bf16, exhaustive_widen_round_trip_midpoints)
{
    int bad = 0;
    for (uint32_t i = 0; i < 65536 && bad < 10; i++) {
        uint16_t b = (uint16_t)i;
        float f = pst_bf16_to_f32(b);
        uint16_t back = pst_f32_to_bf16(f);
        if (bf16_is_nan(b)) {
            if (!isnan(f) || back != (b | 0x0040)) {
                cr_expect_fail("NaN 0x%04x -> 0x%04x", b, back);
                bad++;
            }
            continue;
        }
        if (bits(f) != (uint32_t)b << 16 || back != b) {
            cr_expect_fail("0x%04x -> 0x%08x -> 0x%04x", b, bits(f), back);
            bad++;
        }
    }
    for (uint32_t s = 0; s < 2; s++) {
        for (uint32_t m = 0; m < 0x7f7f && bad < 10; m++) {
            uint16_t lo = (uint16_t)(m | (s << 15)), hi = (uint16_t)((m + 1) | (s << 15));
            uint32_t mid = ((uint32_t)lo << 16) + 0x8000u; /* halfway, as an f32 pattern */
            uint16_t even = (lo & 1) ? hi : lo;
            if (pst_f32_to_bf16(from_bits(mid)) != even ||
                pst_f32_to_bf16(from_bits(mid - 1)) != lo ||
                pst_f32_to_bf16(from_bits(mid + 1)) != hi) {
                cr_expect_fail("bf16 midpoint 0x%08x", mid);
                bad++;
            }
        }
    }
    cr_assert_eq(bad, 0);
}

/* Values that exercise every branch of both conversions, in every cast pair. */
static const float cast_inputs[] = {
    0.0f, -0.0f, 1.0f, -1.5f, 0.1f, 3.14159265f, 65504.0f, 65520.0f, -1e10f,
    0x1p-14f, 0x1p-24f, 0x1p-25f, 1e-30f, 0x1.0101p0f, 1.0f + 0x1p-11f, INFINITY,
    -INFINITY, NAN, 123456.789f, -0.000123f, 0x1.fffffep127f, 2.5e-3f,
};
#define NCAST (sizeof cast_inputs / sizeof cast_inputs[0])

/* Fills buf with cast_inputs converted to type t with the scalar functions. */
static void fill_typed(void *buf, pst_dtype t)
{
    for (size_t i = 0; i < NCAST; i++) {
        if (t == PST_F32) {
            memcpy((char *)buf + 4 * i, &cast_inputs[i], 4);
        } else {
            uint16_t h = t == PST_F16 ? pst_f32_to_f16(cast_inputs[i])
                                      : pst_f32_to_bf16(cast_inputs[i]);
            memcpy((char *)buf + 2 * i, &h, 2);
        }
    }
}

/* The expected element i of cast(src of type st -> dt), from the scalar functions. */
static uint32_t expect_cast(const void *src, pst_dtype st, pst_dtype dt, size_t i)
{
    float f;
    uint16_t h;
    if (st == PST_F32) {
        memcpy(&f, (const char *)src + 4 * i, 4);
    } else {
        memcpy(&h, (const char *)src + 2 * i, 2);
        f = st == PST_F16 ? pst_f16_to_f32(h) : pst_bf16_to_f32(h);
    }
    if (dt == PST_F32)
        return bits(f);
    return dt == PST_F16 ? pst_f32_to_f16(f) : pst_f32_to_bf16(f);
}

Test(cast, all_nine_pairs_unaligned)
{
    for (int st = 0; st < PST_DTYPE_COUNT_; st++) {
        for (int dt = 0; dt < PST_DTYPE_COUNT_; dt++) {
            /* Offset by one byte: pst_cast must not assume alignment. */
            unsigned char sbuf[4 * NCAST + 1], dbuf[4 * NCAST + 8];
            memset(dbuf, 0xab, sizeof dbuf);
            fill_typed(sbuf + 1, (pst_dtype)st);
            pst_cast(dbuf + 1, (pst_dtype)dt, sbuf + 1, (pst_dtype)st, NCAST);
            size_t dsz = pst_dtype_size((pst_dtype)dt);
            for (size_t i = 0; i < NCAST; i++) {
                uint32_t got = 0;
                if (dsz == 4) {
                    memcpy(&got, dbuf + 1 + 4 * i, 4);
                } else {
                    uint16_t g;
                    memcpy(&g, dbuf + 1 + 2 * i, 2);
                    got = g;
                }
                uint32_t want = expect_cast(sbuf + 1, (pst_dtype)st, (pst_dtype)dt, i);
                cr_expect_eq(got, want, "%s -> %s element %zu (%a): 0x%x want 0x%x",
                             pst_dtype_name((pst_dtype)st), pst_dtype_name((pst_dtype)dt),
                             i, (double)cast_inputs[i], got, want);
            }
            cr_expect_eq(dbuf[0], 0xab, "wrote before dst");
            cr_expect_eq(dbuf[1 + dsz * NCAST], 0xab, "wrote past dst");
        }
    }
}

Test(cast, specific_values_and_in_place)
{
    /* f16 -> bf16 keeps the value when it fits bf16's 8 bits, rounds once otherwise. */
    uint16_t h[4] = {0x3c00, 0x7bff, 0x0001, 0xfc00}, b[4];
    pst_cast(b, PST_BF16, h, PST_F16, 4);
    cr_expect_eq(b[0], 0x3f80);
    cr_expect_eq(b[1], 0x4780); /* 65504 = 0x1.ffcp15 rounds up to 65536 */
    cr_expect_eq(b[2], 0x3380); /* 2^-24 */
    cr_expect_eq(b[3], 0xff80);
    /* bf16 -> f16 overflows and underflows like f32 -> f16. */
    uint16_t b2[3] = {0x4780, 0x3380, 0x3300}, h2[3];
    pst_cast(h2, PST_F16, b2, PST_BF16, 3);
    cr_expect_eq(h2[0], 0x7c00);
    cr_expect_eq(h2[1], 0x0001);
    cr_expect_eq(h2[2], 0x0000); /* 2^-25: tie to the even zero */

    float v[3] = {1.0f, -2.0f, NAN};
    pst_cast(v, PST_F32, v, PST_F32, 3); /* same type in place: untouched */
    cr_expect_eq(v[0], 1.0f);
    cr_expect_eq(v[1], -2.0f);
    cr_expect(isnan(v[2]));
    float w[3] = {0};
    pst_cast(w, PST_F32, v, PST_F32, 3);
    cr_expect_eq(memcmp(v, w, sizeof v), 0);

    /* n == 0 and unknown types write nothing. */
    float z = 7.0f;
    pst_cast(&z, PST_F32, v, PST_F32, 0);
    pst_cast(&z, PST_DTYPE_COUNT_, v, PST_F32, 1);
    pst_cast(&z, PST_F32, v, PST_DTYPE_COUNT_, 1);
    cr_expect_eq(z, 7.0f);
}
