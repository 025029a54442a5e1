/* log.h — leveled logger for people (metrics for machines are in metrics.h).
 *
 * Each line: "<time> <LEVEL> <role>[<rank>] step <n>: <message>" on stderr. The level is
 * checked before any formatting. Set-up (pst_log_init) happens once in main(); the step is
 * updated by the training loop. Thread safe: one write(2) per line. */
#ifndef PST_LOG_H
#define PST_LOG_H

typedef enum pst_log_level {
    PST_LOG_DEBUG = 0,
    PST_LOG_INFO,
    PST_LOG_WARN,
    PST_LOG_ERROR,
    PST_LOG_OFF
} pst_log_level;

/* role: "trainer", "pserver", ... (copied); rank -1 for none. */
void pst_log_init(pst_log_level level, const char *role, int rank);
void pst_log_set_level(pst_log_level level);
void pst_log_set_step(long step);
int pst_log_enabled(pst_log_level level);
/* Parses "debug|info|warn|error|off"; returns 0 on success, -1 otherwise. */
int pst_log_level_parse(const char *s, pst_log_level *out);

void pst_log_write(pst_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define PST_LOG(level, ...)                       \
    do {                                          \
        if (pst_log_enabled(level))               \
            pst_log_write((level), __VA_ARGS__);  \
    } while (0)
#define PST_DEBUG(...) PST_LOG(PST_LOG_DEBUG, __VA_ARGS__)
#define PST_INFO(...) PST_LOG(PST_LOG_INFO, __VA_ARGS__)
#define PST_WARN(...) PST_LOG(PST_LOG_WARN, __VA_ARGS__)
#define PST_ERROR(...) PST_LOG(PST_LOG_ERROR, __VA_ARGS__)

#endif /* PST_LOG_H */
