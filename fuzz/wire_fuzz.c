/* wire_fuzz.c — decoding one input three ways, and the payload and key reads (see
 * wire_fuzz.h). */
#include "fuzz/wire_fuzz.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>

#include "fuzz/fuzz_util.h"
#include "rpc/global.h"

uint64_t fuzz_wire_payload(uint64_t h, const rpc_payload *p, int w, uint64_t elems)
{
    pst_status st = rpc_payload_check(p, (pst_dtype)w, elems);
    h = fuzz_hash_u64(h, (uint64_t)st);
    if (st != PST_OK)
        return h;
    /* The check passed: the payload holds exactly elems elements of a known dtype, so
     * these buffers are no larger than the input. */
    const pst_dtype dt = (pst_dtype)w;
    const size_t es = pst_dtype_size(dt), n = (size_t)elems;
    float *f = malloc(sizeof(float) * (n ? n : 1));
    float *g = malloc(sizeof(float) * (n ? n : 1));
    uint8_t *raw = malloc(n > 0 ? n * es : 1);
    FUZZ_CHECK(f && g && raw, "out of memory");
    FUZZ_CHECK(rpc_payload_read_f32(p, dt, 0, f, n) == PST_OK, "read_f32 of a checked payload");
    FUZZ_CHECK(rpc_payload_read(p, 0, raw, n * es) == PST_OK, "read of a checked payload");
    pst_cast(g, PST_F32, raw, dt, n);
    FUZZ_CHECK(memcmp(f, g, sizeof(float) * n) == 0, "read_f32 differs from read + cast");
    const size_t first = n / 3;
    FUZZ_CHECK(rpc_payload_read_f32(p, dt, first, g, n - first) == PST_OK, "partial read_f32");
    FUZZ_CHECK(memcmp(f + first, g, sizeof(float) * (n - first)) == 0,
               "partial read_f32 differs from the whole");
    /* One element past the end, and a range whose end overflows: errors, not reads. */
    FUZZ_CHECK(rpc_payload_read_f32(p, dt, first, g, n - first + 1) == PST_ERR_INVALID,
               "read_f32 past the payload");
    FUZZ_CHECK(rpc_payload_read(p, 1, raw, SIZE_MAX) == PST_ERR_INVALID,
               "read with an overflowing range");
    h = fuzz_hash(h, raw, n * es);
    free(f);
    free(g);
    free(raw);
    return h;
}

uint64_t fuzz_wire_keys(uint64_t h, const rpc_payload *p, uint64_t count, size_t *rest)
{
    uint64_t one;
    if (rest)
        *rest = 0;
    if (count > p->bytes / sizeof one) {
        if (count <= SIZE_MAX / sizeof one)
            FUZZ_CHECK(rpc_payload_read(p, 0, &one, (size_t)count * sizeof one) ==
                           PST_ERR_INVALID,
                       "read of keys past the payload");
        return fuzz_hash_u64(h, (uint64_t)PST_ERR_INVALID);
    }
    /* count keys fit in the payload: the buffer is no larger than the input */
    const size_t n = (size_t)count, after = p->bytes - n * sizeof one;
    uint64_t *keys = malloc(sizeof one * (n ? n : 1));
    FUZZ_CHECK(keys != NULL, "out of memory");
    FUZZ_CHECK(rpc_payload_read(p, 0, keys, n * sizeof one) == PST_OK, "read of the keys");
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(rpc_payload_read(p, i * sizeof one, &one, sizeof one) == PST_OK,
                   "read of one key");
        FUZZ_CHECK(one == keys[i], "a key read alone differs from the keys read at once");
    }
    h = fuzz_hash_u64(h, (uint64_t)PST_OK);
    h = fuzz_hash(h, keys, n * sizeof one);
    free(keys);
    if (rest)
        *rest = after;
    return fuzz_hash_u64(h, after);
}

uint64_t fuzz_wire_payload_after(uint64_t h, const rpc_payload *p, size_t skip, int w,
                                 uint64_t elems)
{
    FUZZ_CHECK(skip <= p->bytes, "skip within the payload");
    rpc_payload rows = *p;
    rows.offset += skip;
    rows.bytes -= skip;
    if (rows.flat)
        rows.flat += skip;
    h = fuzz_wire_payload(h, &rows, w, elems);
    const pst_dtype dt = (pst_dtype)w;
    if (rpc_payload_check(&rows, dt, elems) != PST_OK || skip % pst_dtype_size(dt) != 0)
        return h;
    const size_t n = (size_t)elems; /* checked: no more than the input's bytes */
    float *f = malloc(sizeof(float) * (n ? n : 1));
    float *g = malloc(sizeof(float) * (n ? n : 1));
    FUZZ_CHECK(f && g, "out of memory");
    FUZZ_CHECK(rpc_payload_read_f32(&rows, dt, 0, f, n) == PST_OK, "read_f32 of the rows");
    FUZZ_CHECK(rpc_payload_read_f32(p, dt, skip / pst_dtype_size(dt), g, n) == PST_OK,
               "read_f32 of the rows from the whole payload");
    FUZZ_CHECK(memcmp(f, g, sizeof(float) * n) == 0,
               "the rows read after the keys differ from the rows alone");
    free(f);
    free(g);
    return h;
}

/* Cuts data into slices of 1..7 bytes (sizes cycling from a seed taken from the data). */
static grpc_byte_buffer *cut(const uint8_t *data, size_t size, int compressed)
{
    size_t cap = size + 1, n = 0;
    grpc_slice *s = malloc(sizeof *s * cap);
    FUZZ_CHECK(s != NULL, "out of memory");
    size_t k = size ? data[size - 1] % 7 : 0;
    for (size_t at = 0; at < size; n++) {
        size_t len = 1 + (k + n) % 7;
        if (len > size - at)
            len = size - at;
        s[n] = grpc_slice_from_copied_buffer((const char *)data + at, len);
        at += len;
    }
    grpc_byte_buffer *bb = compressed ? grpc_raw_compressed_byte_buffer_create(s, n,
                                                                               GRPC_COMPRESS_GZIP)
                                      : grpc_raw_byte_buffer_create(s, n);
    for (size_t i = 0; i < n; i++)
        grpc_slice_unref(s[i]);
    free(s);
    return bb;
}

static pst_status decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                         fuzz_wire_use_fn use, uint64_t *h)
{
    rpc_message *m = (rpc_message *)1;
    pst_status st = rpc_wire_decode(bb, desc, &m);
    if (st != PST_OK) {
        FUZZ_CHECK(m == NULL, "a failed decode leaves *out NULL");
        FUZZ_CHECK(pst_error_detail()[0] != '\0', "a failed decode says why");
        *h = 0;
        return st;
    }
    const rpc_payload *p = rpc_message_payload(m);
    FUZZ_CHECK(rpc_message_header(m) != NULL, "a decoded message has a header");
    FUZZ_CHECK(p->offset + p->bytes == p->slices->length, "the payload ends the body");
    *h = use(m);
    rpc_message_free(m);
    return st;
}

void fuzz_wire_run(const ProtobufCMessageDescriptor *desc, fuzz_wire_use_fn use,
                   const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        fuzz_quiet();
        rpc_global_init(); /* for the byte buffers; never shut down (the process ends) */
        init = 1;
    }
    grpc_slice one = grpc_slice_from_copied_buffer((const char *)data, size);
    uint64_t h1, h2, h3;
    pst_status s1 = decode(grpc_raw_byte_buffer_create(&one, 1), desc, use, &h1);
    grpc_slice_unref(one);
    pst_status s2 = decode(cut(data, size, 0), desc, use, &h2);
    FUZZ_CHECK(s1 == s2, "one slice and cut slices decode to different statuses");
    FUZZ_CHECK(h1 == h2, "one slice and cut slices read differently");
    (void)decode(cut(data, size, 1), desc, use, &h3);
}
