/* log.h - leveled logging to stderr, text or JSON lines.
 *
 * Thread-safe: each message is written with one write(2) call. */
#ifndef KILN_LOG_H
#define KILN_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

void log_set_level(enum log_level level);
/* Parses "error", "warn", "info", "debug" (or 0..3); returns -1 if unknown. */
int log_level_parse(const char *s);
/* json != 0 writes one JSON object per line. */
void log_set_json(int json);
int log_enabled(enum log_level level);
void log_write(enum log_level level, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_error(...) log_write(LOG_ERROR, __func__, __VA_ARGS__)
#define log_warn(...) log_write(LOG_WARN, __func__, __VA_ARGS__)
#define log_info(...) log_write(LOG_INFO, __func__, __VA_ARGS__)
#ifndef __cplusplus /* C11 atomics; the CUDA plugin's C++ includes this header and counts no events */
/* One log line at most every interval for an event that may repeat fast
 * (a refused connection, a failed accept). Zero-initialized; any thread. */
struct log_every {
    _Atomic unsigned long long last_ns;
    _Atomic unsigned count;
};
/* Counts one event; 1, with *n the events since the last line, when a line
 * is due (interval_ns after the last one). */
int log_every_due(struct log_every *r, unsigned long long interval_ns, unsigned *n);
#endif

#define log_debug(...) do { if (log_enabled(LOG_DEBUG)) log_write(LOG_DEBUG, __func__, __VA_ARGS__); } while (0)

#endif
