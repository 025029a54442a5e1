/* dtype_math.h — the f32 <-> f16 / bf16 conversions of one element, written once for the
 * host (dtype.c) and the CUDA kernels (nn/cuda/ops_cuda.cu), so a cast gives the same bits
 * on either (dtype.h has the rounding rules). Integer bit arithmetic only: nothing here
 * depends on the FPU mode, the compiler or the device. */
#ifndef PST_DTYPE_MATH_H
#define PST_DTYPE_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define PST_DTYPE_FN static inline __host__ __device__
#else
#define PST_DTYPE_FN static inline
#endif

PST_DTYPE_FN uint32_t pst_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

PST_DTYPE_FN float pst_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

PST_DTYPE_FN uint16_t pst_f16_from_f32(float f)
{
    uint32_t x = pst_f32_bits(f);
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

PST_DTYPE_FN float pst_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x03ffu;

    if (exp == 0x1fu) {
        if (mant == 0)
            return pst_f32_from_bits(sign | 0x7f800000u);
        return pst_f32_from_bits(sign | 0x7fc00000u | (mant << 13)); /* quiet NaN */
    }
    if (exp == 0) {
        if (mant == 0)
            return pst_f32_from_bits(sign);
        /* Subnormal: mant * 2^-24; shift the leading one up to the implicit position. */
        uint32_t e = 113; /* f32 biased exponent of 2^-14 */
        while (!(mant & 0x0400u)) {
            mant <<= 1;
            e--;
        }
        return pst_f32_from_bits(sign | (e << 23) | ((mant & 0x03ffu) << 13));
    }
    return pst_f32_from_bits(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

PST_DTYPE_FN uint16_t pst_bf16_from_f32(float f)
{
    uint32_t x = pst_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN, sign and top payload kept */
    /* Same exponent range as f32: subnormals round like normals and values past the
     * largest bf16 plus half an ulp carry into the infinity pattern. */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

PST_DTYPE_FN float pst_f32_from_bf16(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    if ((b & 0x7fffu) > 0x7f80u)
        x |= 0x00400000u; /* quiet NaN */
    return pst_f32_from_bits(x);
}

#endif /* PST_DTYPE_MATH_H */
