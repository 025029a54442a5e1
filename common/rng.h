/* rng.h — deterministic pseudo-random numbers (xoshiro256** seeded through splitmix64).
 * The same seed gives the same sequence on every machine and build: parameter init,
 * shuffling and synthetic data use it, so runs are reproducible bit for bit.
 * A pst_rng is plain state: not shared between threads without a lock. */
#ifndef PST_RNG_H
#define PST_RNG_H

#include <stdint.h>

typedef struct pst_rng {
    uint64_t s[4];
} pst_rng;

/* Seeds from a 64-bit seed and a stream id (different streams are independent). */
void pst_rng_seed(pst_rng *r, uint64_t seed, uint64_t stream);
uint64_t pst_rng_u64(pst_rng *r);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t pst_rng_below(pst_rng *r, uint64_t n);
/* Uniform float in [0, 1) with 24 random bits. */
float pst_rng_uniform(pst_rng *r);
/* Standard normal (Box-Muller, double precision inside). */
float pst_rng_normal(pst_rng *r);
/* splitmix64's output function: a bijection of the 64-bit words in which every input bit
 * reaches every output bit (a counter's hash, a keyed permutation's round function, the
 * sparse tables' key hash). */
static inline uint64_t pst_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#endif /* PST_RNG_H */
