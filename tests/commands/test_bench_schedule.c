/* Open-loop scheduling with an injected clock: latency is measured from the
 * scheduled send time, so a stalled server shows up in the tail; and the
 * option parsers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "common/hist.h"
#include "commands/bench_schedule.h"

static void test_constant_rate_has_no_drift(void **state) {
    (void)state;
    struct bench_schedule s;
    schedule_init(&s, 3000, 0, 1000, 1);
    uint64_t last = 0;
    for (int i = 0; i < 300000; i++) last = schedule_next(&s);
    /* 300000 requests at 3000/s: the last is scheduled at start + 99.99967 s, exactly. */
    assert_true(llabs((long long)(last - 1000) - (long long)(299999 * 1e9 / 3000)) <= 1);
}

static void test_poisson_mean_gap(void **state) {
    (void)state;
    struct bench_schedule s;
    schedule_init(&s, 1000, 1, 0, 42);
    uint64_t t = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) t = schedule_next(&s);
    double mean_gap_ms = (double)t / (n - 1) / 1e6;
    assert_true(fabs(mean_gap_ms - 1.0) < 0.02);
    /* Same seed, same schedule. */
    struct bench_schedule a, b;
    schedule_init(&a, 500, 1, 0, 7);
    schedule_init(&b, 500, 1, 0, 7);
    for (int i = 0; i < 1000; i++) assert_int_equal(schedule_next(&a), schedule_next(&b));
}

/* A fake server with one connection that answers in 1 ms, except that it
 * stalls for 200 ms once. The generator keeps its schedule (1000/s): requests
 * that fall in the stall wait in the backlog, and their latency, measured from
 * the schedule, includes that wait. A closed-loop measure would show one slow
 * request only. */
static void test_stall_reaches_the_tail(void **state) {
    (void)state;
    const uint64_t ms = 1000000;
    struct bench_schedule s;
    struct bench_backlog bl;
    struct hist *h = malloc(sizeof *h), *closed = malloc(sizeof *closed);
    hist_reset(h);
    hist_reset(closed);
    schedule_init(&s, 1000, 0, 0, 1);
    assert_int_equal(backlog_init(&bl, 100000), 0);
    uint64_t busy_until = 0; /* the single connection's next free time */
    int stalled = 0;
    for (uint64_t now = 0; now < 2000 * ms; now += ms / 10) { /* the injected clock, 0.1 ms steps */
        while (schedule_peek(&s) <= now) assert_int_equal(backlog_push(&bl, schedule_next(&s)), 0);
        uint64_t sched;
        while (busy_until <= now && backlog_pop(&bl, &sched) == 0) {
            uint64_t service = (!stalled && now >= 1000 * ms) ? 200 * ms : 1 * ms / 2;
            if (service > ms) stalled = 1;
            uint64_t start = now > busy_until ? now : busy_until;
            busy_until = start + service;
            hist_record(h, (busy_until - sched) / 1000);      /* from the schedule */
            hist_record(closed, (busy_until - start) / 1000); /* from the actual send */
        }
    }
    assert_true(h->count >= 1990);
    /* ~200 requests were scheduled during the stall: well over 1% of the
     * samples waited tens of ms or more, so p99 sees it... */
    assert_true(hist_quantile(h, 0.99) >= 50000);
    assert_true(h->max >= 199000);
    /* ...while the closed-loop view hides it below p99.9. */
    assert_true(hist_quantile(closed, 0.99) < 1000);
    backlog_free(&bl);
    free(h);
    free(closed);
}

static void test_parsers(void **state) {
    (void)state;
    int lv[16];
    assert_int_equal(parse_levels("1:64:x2", lv, 16), 7);
    assert_int_equal(lv[0], 1);
    assert_int_equal(lv[6], 64);
    assert_int_equal(parse_levels("8:32:+8", lv, 16), 4);
    assert_int_equal(lv[3], 32);
    assert_int_equal(parse_levels("1,8,64", lv, 16), 3);
    assert_int_equal(lv[2], 64);
    assert_int_equal(parse_levels("0", lv, 16), -1);
    assert_int_equal(parse_levels("4:2", lv, 16), -1);
    assert_int_equal(parse_levels("1:8:x1", lv, 16), -1);
    double q[4], us[4];
    assert_int_equal(parse_budget("p99=20ms", q, us, 4), 1);
    assert_true(fabs(q[0] - 0.99) < 1e-12 && fabs(us[0] - 20000) < 1e-9);
    assert_int_equal(parse_budget("p50=500us,p99.9=1.5s", q, us, 4), 2);
    assert_true(fabs(q[1] - 0.999) < 1e-12 && fabs(us[1] - 1.5e6) < 1e-6);
    assert_int_equal(parse_budget("99=20ms", q, us, 4), -1);
    assert_int_equal(parse_budget("p99=20parsecs", q, us, 4), -1);
    assert_int_equal(parse_budget("p101=1ms", q, us, 4), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant_rate_has_no_drift),
        cmocka_unit_test(test_poisson_mean_gap),
        cmocka_unit_test(test_stall_reaches_the_tail),
        cmocka_unit_test(test_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
