/* hash.h — FNV-1a, the one hash of pstrain: fingerprints of plans and settings, the
 * summary's param_hash, the pserver's state hash (not for security: anyone can make a
 * collision). Continue a hash by passing it back as h; start from PST_FNV1A_INIT. */
#ifndef PST_HASH_H
#define PST_HASH_H

#include <stddef.h>
#include <stdint.h>

#define PST_FNV1A_INIT 0xcbf29ce484222325ULL

static inline uint64_t pst_fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *c = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

#endif /* PST_HASH_H */
