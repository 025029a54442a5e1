/* raw_call.h — a unary call made with bare gRPC core, for requests rpc_client would never
 * send (hand-made bodies, unknown methods). Shared by the RPC and cluster suites; include
 * after criterion.h. Every failure is a criterion assertion. */
#ifndef PST_TESTS_RAW_CALL_H
#define PST_TESTS_RAW_CALL_H

#include <stdlib.h>
#include <string.h>

#include <grpc/compression.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "common/clock.h"
#include "rpc/wire.h"

typedef struct raw_result {
    grpc_status_code code;
    char detail[512];
    int pst; /* RPC_STATUS_METADATA_KEY value, -1 when absent */
    double secs;
} raw_result;

/* gzip: the channel compresses the request with gzip (a client the pserver must refuse). */
static raw_result raw_call_gz(int port, const char *method, const void *body, size_t len,
                              int timeout_ms, int gzip)
{
    raw_result r = {.code = GRPC_STATUS_UNKNOWN, .pst = -1};
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_arg arg = {.type = GRPC_ARG_INTEGER,
                    .key = (char *)GRPC_COMPRESSION_CHANNEL_DEFAULT_ALGORITHM,
                    .value.integer = GRPC_COMPRESS_GZIP};
    grpc_channel_args cargs = {1, &arg};
    grpc_channel *ch = grpc_channel_create(target, creds, gzip ? &cargs : NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                               grpc_slice_from_static_string(method), NULL,
                                               deadline, NULL);
    grpc_slice s = grpc_slice_from_copied_buffer(body, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array imd, tmd;
    grpc_metadata_array_init(&imd);
    grpc_metadata_array_init(&tmd);
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &imd;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
    ops[5].data.recv_status_on_client.status = &r.code;
    ops[5].data.recv_status_on_client.status_details = &details;
    double t0 = pst_clock_s();
    cr_assert_eq(grpc_call_start_batch(call, ops, 6, (void *)1, NULL), GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    cr_assert_eq(ev.type, GRPC_OP_COMPLETE);
    r.secs = pst_clock_s() - t0;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof(r.detail))
        n = sizeof(r.detail) - 1;
    memcpy(r.detail, GRPC_SLICE_START_PTR(details), n);
    r.detail[n] = '\0';
    for (size_t i = 0; i < tmd.count; i++)
        if (!grpc_slice_str_cmp(tmd.metadata[i].key, RPC_STATUS_METADATA_KEY)) {
            char num[16] = {0};
            size_t k = GRPC_SLICE_LENGTH(tmd.metadata[i].value);
            memcpy(num, GRPC_SLICE_START_PTR(tmd.metadata[i].value), k < 15 ? k : 15);
            r.pst = atoi(num);
        }
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&imd);
    grpc_metadata_array_destroy(&tmd);
    grpc_byte_buffer_destroy(send);
    if (recv != NULL)
        grpc_byte_buffer_destroy(recv);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return r;
}

static raw_result raw_call(int port, const char *method, const void *body, size_t len,
                           int timeout_ms)
{
    return raw_call_gz(port, method, body, len, timeout_ms, 0);
}

#endif /* PST_TESTS_RAW_CALL_H */
