/* wire_fuzz.h — the part of the wire targets (fuzz_wire_<method>.c) every method shares.
 *
 * An input is one gRPC message body as it arrives ([u32 LE header length][protobuf header]
 * [payload], rpc/wire.h). fuzz_wire_run() decodes it with rpc_wire_decode() three ways: in
 * one slice; cut into slices of 1..7 bytes (so the header and payload elements straddle
 * slices); and marked gzip-compressed (the decompressing path). The method's `use` reads
 * the decoded message as the pserver or the trainer does and returns a hash of everything
 * it read; the one-slice and the cut decodings must agree on the status and on that hash.
 * Not for: the semantic checks of the service (pserver/service.c), which need a store. */
#ifndef PST_FUZZ_WIRE_H
#define PST_FUZZ_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "fuzz/fuzz_util.h"
#include "rpc/wire.h"

/* Reads a decoded message's header and payload; returns a hash of what it read. */
typedef uint64_t (*fuzz_wire_use_fn)(const rpc_message *m);

/* Decodes data as a body of `desc` (three ways, above) and uses each decoded message. */
void fuzz_wire_run(const ProtobufCMessageDescriptor *desc, fuzz_wire_use_fn use,
                   const uint8_t *data, size_t size);

/* The payload read as its header claims (`wire` elements of the wire dtype w, unchecked:
 * an unknown value or a wrong count must be an error status): rpc_payload_check, then every
 * element as f32 (rpc_payload_read_f32) compared with the raw bytes read by
 * rpc_payload_read and cast, and a partial read compared with the whole. Returns h with
 * the statuses and values hashed in. */
uint64_t fuzz_wire_payload(uint64_t h, const rpc_payload *p, int w, uint64_t elems);

/* The first `count` u64 keys of the payload (PullSparse and PushSparse send their keys
 * first), read as the pserver's tables read them (rpc_payload_read) and again one by one;
 * a payload shorter than that must be an error, not a read. Returns h with the status,
 * the keys and the bytes after them hashed in; *rest (optional) gets those bytes (0 when
 * the payload is short). */
uint64_t fuzz_wire_keys(uint64_t h, const rpc_payload *p, uint64_t count, size_t *rest);

/* fuzz_wire_payload on what follows the payload's first `skip` bytes (a PushSparse's rows
 * after its keys; skip <= the payload's bytes), and, when those are `elems` elements of w,
 * the same elements read from the whole payload as the pserver reads them
 * (rpc_payload_read_f32 from element skip / size) compared with them. Returns h as
 * fuzz_wire_payload does. */
uint64_t fuzz_wire_payload_after(uint64_t h, const rpc_payload *p, size_t skip, int w,
                                 uint64_t elems);

#endif /* PST_FUZZ_WIRE_H */
