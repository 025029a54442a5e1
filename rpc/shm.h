/* shm.h — payloads through shared memory between a trainer and a pserver on the same host.
 *
 * On one host a Push or Pull payload over loopback TCP is copied four times (into gRPC,
 * into the kernel, out of it, out of gRPC). With a segment both map, a trainer writes its
 * gradient where the pserver reads it and the pserver writes the values where the trainer
 * reads them: the calls carry the headers only (TensorPipe's shm transport, BytePS's
 * colocated servers do the same).
 *
 * The trainer makes one segment per pserver: a sealed memfd (it cannot shrink, so a mapping
 * never faults) named to the pserver as /proc/<pid>/fd/<fd> in its Init, with a random
 * nonce in its first bytes. The pserver maps it only when it can open that path, the file
 * is a sealed memfd of the size the blocks need and the nonce matches: on another host or
 * in another container it cannot, and the pair keeps the payloads in the calls.
 *
 * Layout of a shard of `total` elements (its blocks in the Init's order, block b at
 * element `shard_off` of the shard): a header of RPC_SHM_HEADER bytes, then the push slots
 * (4 bytes per element, whatever the dtype), then the pull slots (the same). A slot holds
 * its block's elements packed in the call's dtype from the slot's start.
 *
 * The pserver, in turn, keeps the values its pulls serve (the low-precision copy, or the
 * f32 master in fp32) in a segment of its own, a "values area" (blocks in the Init's order,
 * each at a 64-byte boundary: rpc_shm_area_span), and names it in its Init reply to a
 * trainer whose segment it mapped; the trainer maps it read-only and copies a pulled block
 * straight from there, so a pull copies nothing on the pserver.
 *
 * Sync mode only: there a trainer writes a block's push slot again only after its pull of
 * the step, the pserver writes a pull slot only while the trainer waits for that pull, and
 * a block's values change only when every trainer has pushed the next step, which each
 * does only after it has copied the values of this one.
 *
 * Not for: what goes in a call (rpc/wire.h), connections (rpc/client.h, rpc/server.h). */
#ifndef PST_RPC_SHM_H
#define PST_RPC_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/dtype.h"
#include "common/error.h"
#include "rpc/wire.h"

#define RPC_SHM_HEADER 64      /* bytes before the first slot (the nonce first) */
#define RPC_SHM_NAME_MAX 64

typedef struct rpc_shm {
    unsigned char *base; /* the mapping; NULL: none */
    size_t bytes;
    uint64_t total;      /* elements of the shard */
    int fd;              /* the trainer's memfd (-1 on the pserver, or none) */
    char name[RPC_SHM_NAME_MAX]; /* /proc/<pid>/fd/<fd> */
    uint64_t nonce;
    dev_t dev;           /* the file's identity (fstat), to tell two segments apart */
    ino_t ino;
} rpc_shm;

/* Bytes of the segment of a shard of `total` elements; 0 when it would overflow. */
size_t rpc_shm_bytes(uint64_t total);

/* The trainer: a sealed memfd for a shard of `total` elements, mapped, its nonce written.
 * Errors: PST_ERR_UNSUPPORTED (no memfd here), PST_ERR_NOMEM, PST_ERR_IO, with the detail. */
pst_status rpc_shm_create(rpc_shm *s, uint64_t total);

/* The pserver: maps the segment `name` of a trainer, after checking that the name is
 * /proc/<pid>/fd/<fd>, the file a memfd sealed against shrinking, of at least
 * rpc_shm_bytes(total) bytes, with `nonce` at its start, and not the file of `mine` (a
 * segment this process made, its values area, whose name and nonce a trainer learns from
 * its Init reply: mapped as a trainer's, a pull would write over the values; NULL or an
 * empty one: none). Errors: PST_ERR_UNAVAILABLE (not on this host, not reachable, or not
 * the trainer's segment), with why. */
pst_status rpc_shm_attach(rpc_shm *s, const char *name, uint64_t nonce, uint64_t total,
                          const rpc_shm *mine);

/* Block slots: the first byte of the push or the pull slot of the block at element
 * `shard_off` of `length` elements; NULL when that is outside the segment. */
void *rpc_shm_push_slot(const rpc_shm *s, uint64_t shard_off, uint64_t length);
void *rpc_shm_pull_slot(const rpc_shm *s, uint64_t shard_off, uint64_t length);

/* Values areas: the blocks of a shard one after the other in the Init's order, each taking
 * rpc_shm_area_span bytes (its elements, `esize` bytes each, rounded up to 64 bytes), so
 * every block starts on a cache line. */
size_t rpc_shm_area_span(uint64_t length, size_t esize);
/* The pserver: a sealed memfd of `bytes` bytes after the header, mapped read-write, its
 * nonce written. Errors as rpc_shm_create. */
pst_status rpc_shm_create_area(rpc_shm *s, size_t bytes);
/* The trainer: maps a pserver's area read-only, with the checks of rpc_shm_attach. */
pst_status rpc_shm_attach_area(rpc_shm *s, const char *name, uint64_t nonce, size_t bytes);
/* The first byte after the header (where an area's blocks start). */
void *rpc_shm_area(const rpc_shm *s);

/* Unmaps (and closes the trainer's memfd); *s is then empty. Accepts an empty one. */
void rpc_shm_free(rpc_shm *s);

/* ---- the pserver's side: its trainers' segments --------------------------------------- */

/* The segments a pserver's peers (trainers 0..n-1) offered and it mapped. A peer's newer
 * segment (its process restarted) replaces the older one, which stays mapped while the
 * table lives, as a call of the earlier process may still read it: at most 2n + 16 are kept
 * so. Any thread looks a segment up without a lock; the caller serializes the attaches. An
 * all-zero table is empty. */
typedef struct rpc_shm_peers {
    rpc_shm **seg;      /* (n) entries, each published with a release store; NULL: none yet */
    uint32_t n;         /* set with seg, at the first attach */
    rpc_shm **retired;  /* the replaced segments */
    size_t nretired;
} rpc_shm_peers;

/* Maps peer i's segment `name` (rpc_shm_attach's checks, for a shard of `total` elements,
 * never `mine`) and makes it peer i's; the table is sized for n peers at its first attach.
 * Errors (the peer's payloads then stay in the calls; its older segment stays its own):
 * PST_ERR_UNAVAILABLE (not mappable, with why), PST_ERR_LIMIT (too many replaced already),
 * PST_ERR_INVALID (i not below the table's n), PST_ERR_NOMEM. */
pst_status rpc_shm_peers_attach(rpc_shm_peers *p, uint32_t n, uint32_t i, const char *name,
                                uint64_t nonce, uint64_t total, const rpc_shm *mine);

/* Peer i's segment, or NULL (none, or i out of range). Any thread. */
const rpc_shm *rpc_shm_peers_get(const rpc_shm_peers *p, uint32_t i);

/* Unmaps every segment, the replaced ones too; *p is then empty. */
void rpc_shm_peers_free(rpc_shm_peers *p);

/* ---- the trainer's side: one pserver's link ------------------------------------------- */

/* What a trainer shares with one pserver on its host: its own segment, offered in the
 * Init, used once the pserver says it mapped it (`on`), and the pserver's values area,
 * mapped read-only when the pserver names one. An all-zero link is empty. */
typedef struct rpc_shm_link {
    rpc_shm seg;          /* the trainer's segment for the pserver's shard */
    int on;               /* the pserver mapped seg: payloads go through it */
    rpc_shm area;         /* the pserver's values area, or empty */
    pst_dtype area_dtype; /* the dtype of the area's values */
} rpc_shm_link;

/* Makes the segment to offer for a shard of `total` elements, after releasing what the link
 * held (a start again). Errors as rpc_shm_create: the link then stays empty. */
pst_status rpc_shm_link_offer(rpc_shm_link *l, uint64_t total);

/* The pserver's answer to the offer: taken or not (a segment not taken is released).
 * Returns whether the link is on. */
int rpc_shm_link_answer(rpc_shm_link *l, int taken);

/* Maps the values area the pserver named (its blocks take `bytes` bytes, their values of
 * `dtype`), read-only, on a link that is on. Errors as rpc_shm_attach_area, PST_ERR_STATE
 * on a link that is off: pulls then use the slots. */
pst_status rpc_shm_link_attach_area(rpc_shm_link *l, const char *name, uint64_t nonce,
                                    pst_dtype dtype, size_t bytes);

/* Where a push of the block at element `shard_off` (`length` elements) goes: its push slot
 * when the link is on, else NULL (in the call). */
void *rpc_shm_link_push_slot(const rpc_shm_link *l, uint64_t shard_off, uint64_t length);

/* How a pull of that block in `dtype` asks to be answered: *slot, in its pull slot (the
 * link is on); *values, read from the values area at `area_off` (the area holds `dtype`). */
void rpc_shm_link_pull_asks(const rpc_shm_link *l, pst_dtype dtype, int *slot, int *values);

/* Where a pull's values came, as the reply says (`slot`, `values`: its shm and shm_values),
 * as one payload view of `length` elements of `dtype`: in_call (NULL: none), or in shared
 * memory: the block's pull slot or the values area at `area_off`. Errors: PST_ERR_FORMAT
 * for an answer in shared memory this link does not have. */
pst_status rpc_shm_link_pulled(const rpc_shm_link *l, int slot, int values,
                               const rpc_payload *in_call, uint64_t shard_off,
                               size_t area_off, uint64_t length, pst_dtype dtype,
                               rpc_payload *out);

/* Releases the segment and the area; the link is then empty (off). */
void rpc_shm_link_free(rpc_shm_link *l);

#endif /* PST_RPC_SHM_H */
