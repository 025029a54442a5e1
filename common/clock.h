/* clock.h — the one clock pstrain measures with: CLOCK_MONOTONIC in seconds (step times,
 * RPC spans in traces, pslaunch's deadlines). Thread safe. */
#ifndef PST_CLOCK_H
#define PST_CLOCK_H

double pst_clock_s(void);

#endif /* PST_CLOCK_H */
