/* clock.h — the one clock pstrain measures with: CLOCK_MONOTONIC in seconds (step times,
 * RPC spans in traces, pslaunch's deadlines), and a bounded wait on a condition variable.
 * Thread safe. */
#ifndef PST_CLOCK_H
#define PST_CLOCK_H

#include <pthread.h>

double pst_clock_s(void);

/* Waits on cv (mu held by the caller) until it is signalled or ms milliseconds have passed,
 * for loops that check their own condition and deadline. */
void pst_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms);

#endif /* PST_CLOCK_H */
