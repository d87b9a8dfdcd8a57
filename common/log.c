#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

static int g_level = LOG_INFO;
static int g_json;

void log_set_level(enum log_level level) { g_level = level; }
void log_set_json(int json) { g_json = json; }
int log_enabled(enum log_level level) { return (int)level <= g_level; }

int log_level_parse(const char *s) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) return i;
    if (s[0] >= '0' && s[0] <= '3' && s[1] == 0) return s[0] - '0';
    if (strcmp(s, "warning") == 0) return LOG_WARN;
    return -1;
}

/* Escapes s into a JSON string body; truncates to fit. */
static size_t json_escape(char *dst, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { dst[n++] = '\\'; dst[n++] = (char)c; }
        else if (c == '\n') { dst[n++] = '\\'; dst[n++] = 'n'; }
        else if (c < 0x20 || c == 0x7f) n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", c);
        else dst[n++] = (char)c;
    }
    dst[n] = 0;
    return n;
}

/* Escapes the control characters of s (newlines and terminal escapes among
 * them) as \n, \r, \t or \xNN, so text that a client chose, a model name from
 * a URL for one, can never start a line of its own or drive the terminal that
 * shows the log. Truncates to fit. */
static size_t text_escape(char *dst, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') { dst[n++] = '\\'; dst[n++] = 'n'; }
        else if (c == '\r') { dst[n++] = '\\'; dst[n++] = 'r'; }
        else if (c == '\t') { dst[n++] = '\\'; dst[n++] = 't'; }
        else if (c < 0x20 || c == 0x7f) n += (size_t)snprintf(dst + n, cap - n, "\\x%02x", c);
        else dst[n++] = (char)c;
    }
    dst[n] = 0;
    return n;
}

void log_write(enum log_level level, const char *func, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (!log_enabled(level)) return;
    char msg[2048], line[4608], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + tl, sizeof ts - tl, ".%03ldZ", now.tv_nsec / 1000000);
    int n;
    char esc[4200];
    if (g_json) {
        json_escape(esc, sizeof esc, msg);
        n = snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",\"func\":\"%s\",\"msg\":\"%s\"}\n",
                     ts, names[level], func, esc);
    } else {
        text_escape(esc, sizeof esc, msg);
        n = snprintf(line, sizeof line, "%s %-5s %s\n", ts, names[level], esc);
    }
    if (n > (int)sizeof line) n = (int)sizeof line;
    ssize_t w = write(2, line, (size_t)n);
    (void)w;
}

int log_every_due(struct log_every *r, unsigned long long interval_ns, unsigned *n) {
    atomic_fetch_add(&r->count, 1);
    unsigned long long now = clock_now_ns(), last = atomic_load(&r->last_ns);
    if (last && now - last < interval_ns) return 0;
    if (!atomic_compare_exchange_strong(&r->last_ns, &last, now)) return 0;
    *n = atomic_exchange(&r->count, 0);
    return 1;
}
