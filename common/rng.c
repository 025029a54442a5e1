/* rng.c — xoshiro256** (Blackman & Vigna) with splitmix64 seeding; see rng.h. */
#include "common/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    return pst_rng_mix(*x += 0x9e3779b97f4a7c15ULL);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void pst_rng_seed(pst_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t pst_rng_u64(pst_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t pst_rng_below(pst_rng *r, uint64_t n)
{
    /* Rejection sampling on the top of the range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = pst_rng_u64(r);
    } while (x >= limit);
    return x % n;
}

float pst_rng_uniform(pst_rng *r)
{
    return (float)(pst_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

float pst_rng_normal(pst_rng *r)
{
    double u1 = ((double)(pst_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(pst_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
}
