/* global.c — counted grpc_init()/grpc_shutdown() (see global.h). */
#include "rpc/global.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include "common/log.h"

static pthread_mutex_t global_mu = PTHREAD_MUTEX_INITIALIZER;
static int global_refs;
static int detector_off; /* rpc_global_deadlock_detector_off */

/* gRPC's own log lines go to our logger at debug level: whatever fails reaches the
 * caller as a status with a detail, so printing it too would report it twice. */
static void grpc_log_to_debug(gpr_log_func_args *a)
{
    PST_DEBUG("grpc %s:%d: %s", a->file, a->line, a->message);
}

/* Debian builds Abseil without NDEBUG, so every absl::Mutex lock in gRPC also runs
 * Abseil's debugging deadlock detector (a graph of lock ids, updated on each acquisition),
 * a cost per call that small calls feel (bench/rpc_throughput.c; docs/benchmarks.md).
 * Release builds of gRPC run with it off, as here. A C++ function, found by its mangled
 * name (Debian's inline namespace, then none); not found, nothing changes. */
static void absl_deadlock_detection_off(void)
{
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl29SetMutexDeadlockDetectionModeENS_15OnDeadlockCycleE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        if (sym) {
            void (*set_mode)(int);
            memcpy(&set_mode, &sym, sizeof set_mode); /* (object to function pointer) */
            set_mode(0); /* absl::OnDeadlockCycle::kIgnore */
            detector_off = 1;
            PST_DEBUG("Abseil's mutex deadlock detection off (%s)", names[i]);
            return;
        }
    }
    PST_DEBUG("Abseil's mutex deadlock detection: its switch is not in this build; left as is");
}

void rpc_global_init(void)
{
    pthread_mutex_lock(&global_mu);
    if (global_refs++ == 0) {
        absl_deadlock_detection_off();
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

int rpc_global_deadlock_detector_off(void)
{
    pthread_mutex_lock(&global_mu);
    const int off = detector_off;
    pthread_mutex_unlock(&global_mu);
    return off;
}
