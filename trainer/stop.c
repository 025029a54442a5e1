/* stop.c — the trainer's stop flag (train.h: tr_request_stop, tr_stop_requested), apart
 * from the training loops that read it (train.c, ctr.c). */
#include <signal.h>

#include "trainer/train.h"

/* The one global: a signal handler (main.c) can reach nothing else. What else outlives a
 * run is in the caller's tr_job. */
static volatile sig_atomic_t stop_requested;

void tr_request_stop(void)
{
    stop_requested = 1;
}

int tr_stop_requested(void)
{
    return stop_requested != 0;
}
