#include "commands/bench_schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double rng_uniform(uint64_t *s) {
    /* xorshift64*: good enough for arrival gaps, and reproducible by seed. */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return ((double)((x * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}

void schedule_init(struct bench_schedule *s, double rate, int poisson, uint64_t start_ns, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->rate = rate;
    s->poisson = poisson;
    s->start_ns = start_ns;
    s->next_ns = start_ns;
    s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

uint64_t schedule_next(struct bench_schedule *s) {
    uint64_t t = s->next_ns;
    s->seq++;
    if (s->poisson) {
        double gap = -log(rng_uniform(&s->rng)) / s->rate;
        s->next_ns += (uint64_t)(gap * 1e9);
    } else {
        s->next_ns = s->start_ns + (uint64_t)((double)s->seq * 1e9 / s->rate);
    }
    return t;
}

int backlog_init(struct bench_backlog *b, size_t cap) {
    memset(b, 0, sizeof *b);
    b->t = malloc(cap * sizeof *b->t);
    b->cap = cap;
    return b->t ? 0 : -1;
}

void backlog_free(struct bench_backlog *b) {
    free(b->t);
    memset(b, 0, sizeof *b);
}

int backlog_push(struct bench_backlog *b, uint64_t t) {
    if (b->len == b->cap) return -1;
    b->t[(b->head + b->len) % b->cap] = t;
    b->len++;
    return 0;
}

int backlog_pop(struct bench_backlog *b, uint64_t *t) {
    if (!b->len) return -1;
    *t = b->t[b->head];
    b->head = (b->head + 1) % b->cap;
    b->len--;
    return 0;
}

int parse_levels(const char *s, int *out, int max) {
    char *end;
    if (strchr(s, ':')) {
        long a = strtol(s, &end, 10);
        if (*end != ':' || a < 1) return -1;
        long b = strtol(end + 1, &end, 10);
        if (b < a) return -1;
        char op = '*';
        double step = 2;
        if (*end == ':') {
            end++;
            if (*end == 'x' || *end == '*') op = '*', end++;
            else if (*end == '+') op = '+', end++;
            else op = '+';
            step = strtod(end, &end);
            if (*end || step <= (op == '*' ? 1 : 0)) return -1;
        } else if (*end) return -1;
        int n = 0;
        for (double v = (double)a; v <= (double)b + 1e-9 && n < max; v = op == '*' ? v * step : v + step)
            out[n++] = (int)(v + 0.5);
        return n;
    }
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 1) return -1;
        out[n++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return -1;
        p = end;
    }
    return n > 0 ? n : -1;
}

int parse_budget(const char *s, double *q, double *us, int max) {
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        if (*p != 'p' && *p != 'P') return -1;
        char *end;
        double pct = strtod(p + 1, &end);
        if (end == p + 1 || *end != '=' || pct <= 0 || pct > 100) return -1;
        double v = strtod(end + 1, &end);
        if (v <= 0) return -1;
        double mul = 1000; /* ms */
        if (strncmp(end, "ns", 2) == 0) mul = 1e-3, end += 2;
        else if (strncmp(end, "us", 2) == 0) mul = 1, end += 2;
        else if (strncmp(end, "ms", 2) == 0) mul = 1000, end += 2;
        else if (*end == 's') mul = 1e6, end += 1;
        if (*end == ',') end++;
        else if (*end) return -1;
        q[n] = pct / 100.0;
        us[n] = v * mul;
        n++;
        p = end;
    }
    return n > 0 ? n : -1;
}
