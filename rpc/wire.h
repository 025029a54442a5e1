/* wire.h — the framing of pserver messages and the accessors of a received payload.
 *
 * Every gRPC message body of the /pstrain.PServer/ service is
 *   [u32 little-endian header length H][H bytes: packed protobuf header][payload]
 * (see rpc/pstrain.proto). The header is a protobuf-c message; the payload is raw tensor
 * bytes (little-endian elements of a wire dtype) that travel as their own gRPC slice, so a
 * sender's tensor memory is handed to gRPC without a copy and a receiver copies it once,
 * straight from the received slices into its destination (optionally casting to f32).
 *
 * The generated protobuf-c code is built into <build>/gen/rpc/; this header includes it as
 * "rpc/pstrain.pb-c.h", so Pstrain__PushRequest & co. are visible to every user of rpc/.
 *
 * Not for: connections, calls, retries (rpc/server.h, rpc/client.h); semantic checks of a
 * header's fields (the pserver's job) beyond rpc_payload_check().
 *
 * pstrain assumes little-endian hosts (checked at compile time in wire.c): payload
 * elements are copied as they are. All functions here are thread safe on distinct
 * objects; an rpc_message may be read from several threads at once. */
#ifndef PST_RPC_WIRE_H
#define PST_RPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "common/dtype.h"
#include "common/error.h"
#include "rpc/pstrain.pb-c.h"

/* The methods of /pstrain.PServer/; all unary. */
typedef enum rpc_method {
    RPC_METHOD_INIT = 0,
    RPC_METHOD_PUSH,
    RPC_METHOD_PULL,
    RPC_METHOD_FINISH,
    RPC_METHOD_VOTE,
    RPC_METHOD_WATCH,
    RPC_METHOD_PULL_SPARSE,
    RPC_METHOD_PUSH_SPARSE,
    RPC_METHOD_COUNT_
} rpc_method;

/* "Init", "Push", ...; "?" for a value out of range. */
const char *rpc_method_name(rpc_method m);
/* "/pstrain.PServer/Init", ...; NULL for a value out of range. */
const char *rpc_method_path(rpc_method m);
/* The protobuf-c descriptors of a method's request and reply headers (e.g. Push:
 * pstrain__push_request__descriptor, pstrain__push_reply__descriptor); NULL out of range. */
const ProtobufCMessageDescriptor *rpc_method_request_desc(rpc_method m);
const ProtobufCMessageDescriptor *rpc_method_reply_desc(rpc_method m);
/* Whether m's requests carry a payload (Init, Push, PullSparse, PushSparse); the others'
 * bodies are their headers alone. */
int rpc_method_request_payload(rpc_method m);

/* Called once when the transport no longer needs a payload the caller lent it. */
typedef void (*rpc_release_fn)(void *arg);

/* Largest accepted header (a plan of a few thousand blocks needs tens of KiB). */
#define RPC_WIRE_MAX_HEADER (16u << 20)

/* Trailing metadata key carrying the exact pst_status of a failed call (decimal), since
 * several statuses share a gRPC code. */
#define RPC_STATUS_METADATA_KEY "pst-status"

/* ---- received messages ------------------------------------------------------------ */

/* A received payload, wherever it travelled: in the call, `bytes` bytes starting `offset`
 * bytes into the message body held in `slices` (which may be cut anywhere, in many slices;
 * owned by its rpc_message, valid as long as that message); or, through shared memory on
 * one host (rpc/shm.h), `bytes` contiguous bytes at `flat` (rpc_payload_shared). The
 * readers below take either, so the pserver and the trainer read a payload one way. */
typedef struct rpc_payload {
    const grpc_slice_buffer *slices; /* the whole message body (NULL with flat) */
    size_t offset;                   /* first payload byte within the body */
    size_t bytes;                    /* payload length */
    const unsigned char *flat;       /* shared memory: the bytes themselves; NULL: slices */
    int peer_writable;               /* flat memory the sending process can still write:
                                      * read each element once (see ps_store_push) */
} rpc_payload;

/* A payload of `bytes` bytes at `at` in shared memory; peer_writable: the other process
 * maps it writable (a trainer's push slot), so what is read may change between reads. */
rpc_payload rpc_payload_shared(const void *at, size_t bytes, int peer_writable);

/* Copies payload bytes [offset, offset + bytes) into dst (one copy from the slices).
 * Errors: PST_ERR_INVALID when the range is outside the payload. */
pst_status rpc_payload_read(const rpc_payload *p, size_t offset, void *dst, size_t bytes);

/* Reads elements [first, first + n) of a payload whose elements are of type `wire` into
 * dst as f32, converting while copying (pst_cast), single pass over the slices.
 * Errors: PST_ERR_INVALID for a range outside the payload or an unknown dtype. */
pst_status rpc_payload_read_f32(const rpc_payload *p, pst_dtype wire, size_t first,
                                float *dst, size_t n);

/* Checks that the payload is exactly `elems` elements of `dt`, as its header claims.
 * Errors: PST_ERR_FORMAT with both sizes in the detail. */
pst_status rpc_payload_check(const rpc_payload *p, pst_dtype dt, uint64_t elems);

/* A decoded message: the unpacked header and the payload left in the received slices. */
typedef struct rpc_message rpc_message;

/* The unpacked header; cast it to the method's type (e.g. (const Pstrain__PushRequest *)).
 * Owned by the message. */
const ProtobufCMessage *rpc_message_header(const rpc_message *m);
const rpc_payload *rpc_message_payload(const rpc_message *m);
/* Releases the header and the received slices. Accepts NULL. */
void rpc_message_free(rpc_message *m);

/* A message's payload moved out of it, still in the received slices (no copy), for a
 * reader that keeps it past the message (the pserver keeps a sync push until its step's
 * update instead of copying it). */
typedef struct rpc_kept_payload rpc_kept_payload;
/* Moves the payload out of m: m keeps its header and its payload reads as 0 bytes from
 * then on. NULL (m unchanged) when the payload is empty or out of memory. */
rpc_kept_payload *rpc_message_keep_payload(rpc_message *m);
/* The kept payload; valid until rpc_kept_payload_free. */
const rpc_payload *rpc_kept_payload_view(const rpc_kept_payload *k);
/* Releases the slices; any thread. Accepts NULL. */
void rpc_kept_payload_free(rpc_kept_payload *k);

/* ---- encoding and decoding -------------------------------------------------------- */

/* Builds a message body: a slice with the 4-byte length and the packed header, then (when
 * bytes > 0) a second slice that references `payload` without copying it.
 * Ownership: the caller keeps `payload` alive and unchanged until release(arg) runs; it
 * runs exactly once, on any thread, when gRPC drops its last reference to the payload
 * (possibly after the call that sent it completed), or before this function returns when
 * it fails or when bytes == 0. release == NULL means the memory outlives every use (e.g.
 * it lives until the process exits or the owner knows the calls are over).
 * *out is a new byte buffer owned by the caller (grpc_byte_buffer_destroy), NULL on error.
 * Errors: PST_ERR_INVALID for a header that fails protobuf_c_message_check or is larger
 * than RPC_WIRE_MAX_HEADER, or a NULL payload with bytes > 0. Requires rpc_global_init(). */
pst_status rpc_wire_encode(const ProtobufCMessage *header, const void *payload, size_t bytes,
                           rpc_release_fn release, void *arg, grpc_byte_buffer **out);

/* The two halves of rpc_wire_encode, for senders that resend the same message (retries):
 * a new slice holding the length prefix and the packed header (caller unrefs it), and a
 * slice lending `payload` (bytes > 0) under the release contract above. */
pst_status rpc_wire_header_slice(const ProtobufCMessage *header, grpc_slice *out);
grpc_slice rpc_wire_payload_slice(const void *payload, size_t bytes, rpc_release_fn release,
                                  void *arg);

/* Decodes a received body whose header is of type `desc`. Takes ownership of `bb` in
 * every case (NULL is accepted and reported as a missing message). On success *out is a
 * new message (rpc_message_free); on failure *out is NULL.
 * Errors: PST_ERR_FORMAT — no message, shorter than 4 bytes, a header length beyond the
 * message or RPC_WIRE_MAX_HEADER, a header that does not parse, an undecompressible body;
 * PST_ERR_NOMEM. The detail names the problem and the sizes. */
pst_status rpc_wire_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                           rpc_message **out);

/* ---- dtypes and statuses on the wire ---------------------------------------------- */

/* Wire DType <-> pst_dtype (same numbering). from_wire: PST_ERR_FORMAT for an unknown
 * value (proto3 enums are open). */
pst_status rpc_dtype_from_wire(Pstrain__DType w, pst_dtype *out);
Pstrain__DType rpc_dtype_to_wire(pst_dtype t);

/* pst_status -> gRPC status code: INVALID, FORMAT -> INVALID_ARGUMENT; NOT_FOUND ->
 * NOT_FOUND; MISMATCH, STATE -> FAILED_PRECONDITION; UNAVAILABLE -> UNAVAILABLE; TIMEOUT ->
 * DEADLINE_EXCEEDED; NOMEM -> RESOURCE_EXHAUSTED; UNSUPPORTED -> UNIMPLEMENTED; IO ->
 * DATA_LOSS; INTERNAL and unknown -> INTERNAL; OK -> OK. */
grpc_status_code rpc_status_to_grpc(pst_status st);
/* gRPC status code -> pst_status, for replies without RPC_STATUS_METADATA_KEY: the
 * inverse of the above where it is one-to-one, FAILED_PRECONDITION, ABORTED, CANCELLED,
 * ALREADY_EXISTS -> STATE; OUT_OF_RANGE, PERMISSION_DENIED, UNAUTHENTICATED -> INVALID;
 * UNKNOWN -> INTERNAL. */
pst_status rpc_status_from_grpc(grpc_status_code code);

#endif /* PST_RPC_WIRE_H */
