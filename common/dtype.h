/* dtype.h — element types on devices and on the wire: f32, f16 (IEEE binary16), bf16.
 * Conversions from f32 round to nearest, ties to even; NaN stays NaN (quiet), infinities
 * and signed zeros are kept, f16 subnormals are produced and read exactly, values beyond
 * the f16 range become infinity (|f| >= 65520, the tie above 65504, rounds to infinity).
 * A NaN keeps its sign and the top bits of its payload; a signalling NaN comes out quiet,
 * so f16 -> f32 -> f16 (and bf16 -> f32 -> bf16) is the identity on every bit pattern
 * except that NaNs gain their quiet bit. The bits never depend on the FPU mode or build.
 * Pure functions, thread safe. */
#ifndef PST_DTYPE_H
#define PST_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum pst_dtype { PST_F32 = 0, PST_F16 = 1, PST_BF16 = 2, PST_DTYPE_COUNT_ } pst_dtype;

size_t pst_dtype_size(pst_dtype t);         /* 4, 2, 2; 0 for an unknown type */
const char *pst_dtype_name(pst_dtype t);    /* "f32", "f16", "bf16"; "unknown" otherwise */
/* Parses "f32|fp32|float32", "f16|fp16|float16", "bf16|bfloat16"; 0 on success, -1 else. */
int pst_dtype_parse(const char *s, pst_dtype *out);

uint16_t pst_f32_to_f16(float f);
float pst_f16_to_f32(uint16_t h);
uint16_t pst_f32_to_bf16(float f);
float pst_bf16_to_f32(uint16_t b);

/* Converts n elements from src (of type st) to dst (of type dt); dst and src must not
 * overlap unless dt == st and dst == src. Neither needs to be aligned. Every one of the
 * 9 pairs rounds once (f16 <-> bf16 goes through an exact f32). An unknown type
 * converts nothing. */
void pst_cast(void *dst, pst_dtype dt, const void *src, pst_dtype st, size_t n);

/* Put before a function whose loops are integer arithmetic on bit patterns (casts, NaN
 * checks) or elementwise float arithmetic (GELU, LayerNorm, softmax, bias adds), so that
 * every instruction set gives the same bits: GCC builds it for x86-64-v4 (AVX-512), v3
 * (AVX2) and the baseline, and the loader picks one. Float loops stay bit-exact because
 * the build never contracts a*b+c into an FMA (-ffp-contract=off, CMakeLists.txt) and GCC
 * reorders no float sum without -ffast-math: a wider vector computes each element with the
 * same operations in the same order. Not under the
 * sanitizers: their runtimes start after the loader runs the clones' resolver, which then
 * crashes the program before main. */
#if defined(__FAST_MATH__) || defined(__ASSOCIATIVE_MATH__)
#error "-ffast-math or -fassociative-math reorders float sums: pstrain's bits (and the clones' equality) need IEEE order"
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&                      \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PST_BIT_EXACT_CLONES                                                                \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PST_BIT_EXACT_CLONES
#endif

#endif /* PST_DTYPE_H */
