/* wire.c — framing of pserver messages: [u32 LE header length][protobuf header][payload].
 *
 * Encoding lends the payload to gRPC as its own slice (no copy); decoding leaves the
 * payload in the received slices and copies it once on request. Not for: calls and
 * connections (server.c, client.c). */
#include "rpc/wire.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "common/memory.h"
#include "rpc/tsan.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pstrain's wire format copies payload elements as they are: little-endian hosts only"
#endif

_Static_assert((int)PSTRAIN__DTYPE__F32 == (int)PST_F32 &&
                   (int)PSTRAIN__DTYPE__F16 == (int)PST_F16 &&
                   (int)PSTRAIN__DTYPE__BF16 == (int)PST_BF16,
               "wire DType and pst_dtype share their numbering");

struct rpc_message {
    grpc_byte_buffer *bb;     /* raw, uncompressed body; owns the slices */
    ProtobufCMessage *header; /* unpacked with the default allocator */
    rpc_payload payload;
};

static const struct {
    const char *name;
    const char *path;
    const ProtobufCMessageDescriptor *req;
    const ProtobufCMessageDescriptor *rep;
} methods[RPC_METHOD_COUNT_] = {
    [RPC_METHOD_INIT] = {"Init", "/pstrain.PServer/Init", &pstrain__init_request__descriptor,
                         &pstrain__init_reply__descriptor},
    [RPC_METHOD_PUSH] = {"Push", "/pstrain.PServer/Push", &pstrain__push_request__descriptor,
                         &pstrain__push_reply__descriptor},
    [RPC_METHOD_PULL] = {"Pull", "/pstrain.PServer/Pull", &pstrain__pull_request__descriptor,
                         &pstrain__pull_reply__descriptor},
    [RPC_METHOD_FINISH] = {"Finish", "/pstrain.PServer/Finish",
                           &pstrain__finish_request__descriptor,
                           &pstrain__finish_reply__descriptor},
    [RPC_METHOD_VOTE] = {"Vote", "/pstrain.PServer/Vote", &pstrain__vote_request__descriptor,
                         &pstrain__vote_reply__descriptor},
    [RPC_METHOD_WATCH] = {"Watch", "/pstrain.PServer/Watch",
                          &pstrain__watch_request__descriptor, &pstrain__watch_reply__descriptor},
    [RPC_METHOD_PULL_SPARSE] = {"PullSparse", "/pstrain.PServer/PullSparse",
                                &pstrain__pull_sparse_request__descriptor,
                                &pstrain__pull_sparse_reply__descriptor},
    [RPC_METHOD_PUSH_SPARSE] = {"PushSparse", "/pstrain.PServer/PushSparse",
                                &pstrain__push_sparse_request__descriptor,
                                &pstrain__push_sparse_reply__descriptor},
};

const char *rpc_method_name(rpc_method m)
{
    return (unsigned)m < RPC_METHOD_COUNT_ ? methods[m].name : "?";
}

const char *rpc_method_path(rpc_method m)
{
    return (unsigned)m < RPC_METHOD_COUNT_ ? methods[m].path : NULL;
}

const ProtobufCMessageDescriptor *rpc_method_request_desc(rpc_method m)
{
    return (unsigned)m < RPC_METHOD_COUNT_ ? methods[m].req : NULL;
}

int rpc_method_request_payload(rpc_method m)
{
    return m == RPC_METHOD_INIT || m == RPC_METHOD_PUSH || m == RPC_METHOD_PULL_SPARSE ||
           m == RPC_METHOD_PUSH_SPARSE;
}

const ProtobufCMessageDescriptor *rpc_method_reply_desc(rpc_method m)
{
    return (unsigned)m < RPC_METHOD_COUNT_ ? methods[m].rep : NULL;
}

/* ---- slice-buffer reading ------------------------------------------------------------ */

/* Finds the slice holding body byte `off`: returns its index and sets *in to the offset
 * inside it. Requires off < sb->length. */
static size_t sb_seek(const grpc_slice_buffer *sb, size_t off, size_t *in)
{
    size_t i = 0;
    while (off >= GRPC_SLICE_LENGTH(sb->slices[i])) {
        off -= GRPC_SLICE_LENGTH(sb->slices[i]);
        i++;
    }
    *in = off;
    return i;
}

/* Copies body bytes [off, off + n) to dst; the range must be inside the body. */
static void sb_copy(const grpc_slice_buffer *sb, size_t off, void *dst, size_t n)
{
    if (n == 0)
        return;
    uint8_t *d = dst;
    size_t in;
    size_t i = sb_seek(sb, off, &in);
    const int stream = n >= PST_COPY_STREAM_MIN; /* (a pulled block into the parameters) */
    while (n > 0) {
        const uint8_t *s = GRPC_SLICE_START_PTR(sb->slices[i]) + in;
        size_t take = GRPC_SLICE_LENGTH(sb->slices[i]) - in;
        if (take > n)
            take = n;
        if (stream)
            pst_copy_stream(d, s, take);
        else
            memcpy(d, s, take);
        d += take;
        n -= take;
        in = 0;
        i++;
    }
}

static pst_status payload_range(const rpc_payload *p, size_t offset, size_t bytes)
{
    if (offset > p->bytes || bytes > p->bytes - offset)
        return pst_error_set(PST_ERR_INVALID,
                             "payload range [%zu, %zu + %zu) is outside its %zu bytes", offset,
                             offset, bytes, p->bytes);
    return PST_OK;
}

rpc_payload rpc_payload_shared(const void *at, size_t bytes, int peer_writable)
{
    return (rpc_payload){.bytes = bytes, .flat = at, .peer_writable = peer_writable != 0};
}

pst_status rpc_payload_read(const rpc_payload *p, size_t offset, void *dst, size_t bytes)
{
    PST_TRY(payload_range(p, offset, bytes));
    if (p->flat)
        memcpy(dst, p->flat + offset, bytes);
    else
        sb_copy(p->slices, p->offset + offset, dst, bytes);
    return PST_OK;
}

pst_status rpc_payload_read_f32(const rpc_payload *p, pst_dtype wire, size_t first,
                                float *dst, size_t n)
{
    if ((unsigned)wire >= PST_DTYPE_COUNT_)
        return pst_error_set(PST_ERR_INVALID, "payload dtype %d is not f32, f16 or bf16",
                             (int)wire);
    size_t es = pst_dtype_size(wire);
    if (first > SIZE_MAX / es || n > SIZE_MAX / es)
        return pst_error_set(PST_ERR_INVALID, "payload range of %zu elements overflows", n);
    PST_TRY(payload_range(p, first * es, n * es));
    if (wire == PST_F32 || n == 0)
        return rpc_payload_read(p, first * es, dst, n * es);
    if (p->flat) {
        pst_cast(dst, PST_F32, p->flat + first * es, wire, n);
        return PST_OK;
    }
    /* Walk the slices once; an element cut by a slice boundary is gathered in `part`. */
    const grpc_slice_buffer *sb = p->slices;
    size_t in;
    size_t i = sb_seek(sb, p->offset + first * es, &in);
    uint8_t part[4];
    size_t have = 0; /* bytes of a cut element gathered so far */
    size_t done = 0; /* elements written */
    while (done < n) {
        const uint8_t *s = GRPC_SLICE_START_PTR(sb->slices[i]) + in;
        size_t len = GRPC_SLICE_LENGTH(sb->slices[i]) - in;
        size_t rest = (n - done) * es - have; /* payload bytes still to consume */
        if (len > rest)
            len = rest;
        if (have > 0) {
            size_t take = es - have < len ? es - have : len;
            memcpy(part + have, s, take);
            have += take;
            s += take;
            len -= take;
            if (have == es) {
                pst_cast(dst + done, PST_F32, part, wire, 1);
                done++;
                have = 0;
            }
        }
        size_t whole = len / es;
        pst_cast(dst + done, PST_F32, s, wire, whole);
        done += whole;
        size_t tail = len - whole * es;
        if (tail > 0) {
            memcpy(part, s + whole * es, tail);
            have = tail;
        }
        in = 0;
        i++;
    }
    return PST_OK;
}

pst_status rpc_payload_check(const rpc_payload *p, pst_dtype dt, uint64_t elems)
{
    if ((unsigned)dt >= PST_DTYPE_COUNT_)
        return pst_error_set(PST_ERR_FORMAT, "payload dtype %d is not f32, f16 or bf16",
                             (int)dt);
    size_t es = pst_dtype_size(dt);
    if (elems > SIZE_MAX / es || p->bytes != elems * es)
        return pst_error_set(PST_ERR_FORMAT,
                             "payload has %zu bytes but the header says %llu %s elements",
                             p->bytes, (unsigned long long)elems, pst_dtype_name(dt));
    return PST_OK;
}

const ProtobufCMessage *rpc_message_header(const rpc_message *m)
{
    return m->header;
}

const rpc_payload *rpc_message_payload(const rpc_message *m)
{
    return &m->payload;
}

void rpc_message_free(rpc_message *m)
{
    if (m == NULL)
        return;
    if (m->header != NULL)
        protobuf_c_message_free_unpacked(m->header, NULL);
    if (m->bb != NULL)
        grpc_byte_buffer_destroy(m->bb);
    free(m);
}

struct rpc_kept_payload {
    grpc_byte_buffer *bb; /* the message's body: owns the slices */
    rpc_payload payload;  /* points into bb's slice buffer, which does not move */
};

rpc_kept_payload *rpc_message_keep_payload(rpc_message *m)
{
    if (m == NULL || m->bb == NULL || m->payload.bytes == 0)
        return NULL;
    rpc_kept_payload *k = malloc(sizeof *k);
    if (k == NULL)
        return NULL;
    *k = (rpc_kept_payload){m->bb, m->payload};
    m->bb = NULL;
    m->payload = (rpc_payload){0};
    return k;
}

const rpc_payload *rpc_kept_payload_view(const rpc_kept_payload *k)
{
    return &k->payload;
}

void rpc_kept_payload_free(rpc_kept_payload *k)
{
    if (k == NULL)
        return;
    grpc_byte_buffer_destroy(k->bb);
    free(k);
}

/* ---- encoding -------------------------------------------------------------------------- */

pst_status rpc_wire_header_slice(const ProtobufCMessage *header, grpc_slice *out)
{
    if (header == NULL || !protobuf_c_message_check(header))
        return pst_error_set(PST_ERR_INVALID, "rpc header %s is incomplete (NULL field)",
                             header != NULL ? header->descriptor->name : "(null)");
    size_t h = protobuf_c_message_get_packed_size(header);
    if (h > RPC_WIRE_MAX_HEADER)
        return pst_error_set(PST_ERR_INVALID, "rpc header %s packs to %zu bytes (limit %u)",
                             header->descriptor->name, h, RPC_WIRE_MAX_HEADER);
    grpc_slice s = grpc_slice_malloc(4 + h);
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
    p[2] = (uint8_t)(h >> 16);
    p[3] = (uint8_t)(h >> 24);
    protobuf_c_message_pack(header, p + 4);
    *out = s;
    return PST_OK;
}

#if defined(__SANITIZE_THREAD__)
/* A TSan build only: gRPC runs a payload's release on whichever of its threads drops the
 * slice last, ordered after the send by gRPC's own (uninstrumented) synchronization. The
 * release is called through this trampoline, which states that order (rpc/tsan.h). */
typedef struct tsan_release {
    rpc_release_fn fn;
    void *arg;
} tsan_release;

static void tsan_release_entry(void *p)
{
    RPC_TSAN_ACQUIRE(p);
    tsan_release r = *(tsan_release *)p;
    free(p);
    r.fn(r.arg);
}
#endif

grpc_slice rpc_wire_payload_slice(const void *payload, size_t bytes, rpc_release_fn release,
                                  void *arg)
{
    /* gRPC only reads a slice it sends; the cast drops const for its generic pointer. */
    void *p = (void *)(uintptr_t)payload;
    if (release == NULL)
        return grpc_slice_from_static_buffer(p, bytes);
#if defined(__SANITIZE_THREAD__)
    tsan_release *r = malloc(sizeof *r);
    if (r) {
        *r = (tsan_release){release, arg};
        RPC_TSAN_RELEASE(r);
        return grpc_slice_new_with_user_data(p, bytes, tsan_release_entry, r);
    }
#endif
    return grpc_slice_new_with_user_data(p, bytes, release, arg);
}

pst_status rpc_wire_encode(const ProtobufCMessage *header, const void *payload, size_t bytes,
                           rpc_release_fn release, void *arg, grpc_byte_buffer **out)
{
    *out = NULL;
    grpc_slice s[2];
    pst_status st = bytes > 0 && payload == NULL
                        ? pst_error_set(PST_ERR_INVALID, "rpc payload of %zu bytes is NULL",
                                        bytes)
                        : rpc_wire_header_slice(header, &s[0]);
    if (st != PST_OK || bytes == 0) {
        if (release != NULL)
            release(arg);
        if (st != PST_OK)
            return st;
        *out = grpc_raw_byte_buffer_create(s, 1);
        grpc_slice_unref(s[0]);
        return PST_OK;
    }
    s[1] = rpc_wire_payload_slice(payload, bytes, release, arg);
    *out = grpc_raw_byte_buffer_create(s, 2); /* takes its own references */
    grpc_slice_unref(s[0]);
    grpc_slice_unref(s[1]);
    return PST_OK;
}

/* ---- decoding -------------------------------------------------------------------------- */

pst_status rpc_wire_decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                           rpc_message **out)
{
    *out = NULL;
    if (bb == NULL)
        return pst_error_set(PST_ERR_FORMAT, "no message (the peer sent an empty stream)");
    if (bb->type != GRPC_BB_RAW) {
        grpc_byte_buffer_destroy(bb);
        return pst_error_set(PST_ERR_FORMAT, "message is not a raw byte buffer");
    }
    if (bb->data.raw.compression != GRPC_COMPRESS_NONE) {
        /* The reader decompresses; the copy is the price of a compressing peer. */
        grpc_byte_buffer_reader r;
        if (!grpc_byte_buffer_reader_init(&r, bb)) {
            grpc_byte_buffer_destroy(bb);
            return pst_error_set(PST_ERR_FORMAT, "compressed message does not decompress");
        }
        grpc_byte_buffer *plain = grpc_raw_byte_buffer_from_reader(&r);
        grpc_byte_buffer_reader_destroy(&r);
        grpc_byte_buffer_destroy(bb);
        bb = plain;
    }
    const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
    size_t total = sb->length;
    pst_status st = PST_OK;
    uint8_t *tmp = NULL;
    rpc_message *m = NULL;
    if (total < 4) {
        st = pst_error_set(PST_ERR_FORMAT,
                           "%s message of %zu bytes is shorter than its 4-byte header length",
                           desc->name, total);
        goto error;
    }
    uint8_t len4[4];
    sb_copy(sb, 0, len4, 4);
    uint32_t h = (uint32_t)len4[0] | (uint32_t)len4[1] << 8 | (uint32_t)len4[2] << 16 |
                 (uint32_t)len4[3] << 24;
    if (h > total - 4 || h > RPC_WIRE_MAX_HEADER) {
        st = pst_error_set(PST_ERR_FORMAT,
                           "%s header length %u exceeds the message (%zu bytes after the "
                           "length, limit %u)",
                           desc->name, h, total - 4, RPC_WIRE_MAX_HEADER);
        goto error;
    }
    /* The header is parsed in place when one slice holds it, else gathered. */
    const uint8_t *hp = NULL;
    size_t in;
    size_t i = h > 0 ? sb_seek(sb, 4, &in) : 0;
    if (h > 0 && GRPC_SLICE_LENGTH(sb->slices[i]) - in >= h) {
        hp = GRPC_SLICE_START_PTR(sb->slices[i]) + in;
    } else if (h > 0) {
        tmp = malloc(h);
        if (tmp == NULL) {
            st = pst_error_set(PST_ERR_NOMEM, "%u bytes for a %s header", h, desc->name);
            goto error;
        }
        sb_copy(sb, 4, tmp, h);
        hp = tmp;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        st = pst_error_set(PST_ERR_NOMEM, "rpc message");
        goto error;
    }
    m->header = protobuf_c_message_unpack(desc, NULL, h, hp);
    if (m->header == NULL) {
        st = pst_error_set(PST_ERR_FORMAT, "%s header (%u bytes) is not a valid protobuf",
                           desc->name, h);
        goto error;
    }
    free(tmp);
    m->bb = bb;
    m->payload.slices = &bb->data.raw.slice_buffer;
    m->payload.offset = 4 + (size_t)h;
    m->payload.bytes = total - 4 - h;
    *out = m;
    return PST_OK;

error:
    free(tmp);
    free(m);
    grpc_byte_buffer_destroy(bb);
    return st;
}

/* ---- dtypes and statuses --------------------------------------------------------------- */

pst_status rpc_dtype_from_wire(Pstrain__DType w, pst_dtype *out)
{
    if ((unsigned)w >= PST_DTYPE_COUNT_)
        return pst_error_set(PST_ERR_FORMAT, "wire dtype %d is not F32, F16 or BF16", (int)w);
    *out = (pst_dtype)w;
    return PST_OK;
}

Pstrain__DType rpc_dtype_to_wire(pst_dtype t)
{
    return (Pstrain__DType)t;
}

grpc_status_code rpc_status_to_grpc(pst_status st)
{
    switch (st) {
    case PST_OK: return GRPC_STATUS_OK;
    case PST_ERR_INVALID: return GRPC_STATUS_INVALID_ARGUMENT;
    case PST_ERR_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case PST_ERR_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case PST_ERR_IO: return GRPC_STATUS_DATA_LOSS;
    case PST_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case PST_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case PST_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case PST_ERR_STATE: return GRPC_STATUS_FAILED_PRECONDITION;
    case PST_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case PST_ERR_MISMATCH: return GRPC_STATUS_FAILED_PRECONDITION;
    case PST_ERR_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case PST_ERR_AUTH: return GRPC_STATUS_UNAUTHENTICATED;
    case PST_ERR_LIMIT: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case PST_ERR_DENIED: return GRPC_STATUS_PERMISSION_DENIED;
    case PST_ERR_INTERNAL:
    default: return GRPC_STATUS_INTERNAL;
    }
}

pst_status rpc_status_from_grpc(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK: return PST_OK;
    case GRPC_STATUS_OUT_OF_RANGE: return PST_ERR_RANGE;
    case GRPC_STATUS_INVALID_ARGUMENT: return PST_ERR_INVALID;
    case GRPC_STATUS_PERMISSION_DENIED: return PST_ERR_DENIED;
    case GRPC_STATUS_UNAUTHENTICATED: return PST_ERR_AUTH;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return PST_ERR_NOMEM;
    case GRPC_STATUS_DATA_LOSS: return PST_ERR_IO;
    case GRPC_STATUS_NOT_FOUND: return PST_ERR_NOT_FOUND;
    case GRPC_STATUS_UNAVAILABLE: return PST_ERR_UNAVAILABLE;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return PST_ERR_TIMEOUT;
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_ABORTED:
    case GRPC_STATUS_CANCELLED:
    case GRPC_STATUS_ALREADY_EXISTS: return PST_ERR_STATE;
    case GRPC_STATUS_UNIMPLEMENTED: return PST_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNKNOWN:
    case GRPC_STATUS_INTERNAL:
    default: return PST_ERR_INTERNAL;
    }
}
