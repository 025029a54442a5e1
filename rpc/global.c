/* global.c — counted grpc_init()/grpc_shutdown() (see global.h). */
#include "rpc/global.h"

#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include "common/log.h"

static pthread_mutex_t global_mu = PTHREAD_MUTEX_INITIALIZER;
static int global_refs;

/* gRPC's own log lines go to our logger at debug level: whatever fails reaches the
 * caller as a status with a detail, so printing it too would report it twice. */
static void grpc_log_to_debug(gpr_log_func_args *a)
{
    PST_DEBUG("grpc %s:%d: %s", a->file, a->line, a->message);
}

void rpc_global_init(void)
{
    pthread_mutex_lock(&global_mu);
    if (global_refs++ == 0) {
        gpr_set_log_function(grpc_log_to_debug);
        grpc_init();
    }
    pthread_mutex_unlock(&global_mu);
}

void rpc_global_shutdown(void)
{
    pthread_mutex_lock(&global_mu);
    if (global_refs > 0 && --global_refs == 0)
        grpc_shutdown();
    pthread_mutex_unlock(&global_mu);
}
