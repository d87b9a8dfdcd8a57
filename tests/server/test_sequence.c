/* test_sequence.c - the sequence batcher in front of a real batcher, with an
 * executor of the test's own: an accumulator, ACC_OUT = ACC_IN * (1 - START)
 * + INPUT and OUTPUT = ACC_OUT, row by row, so that each sequence's answers
 * show that its requests ran in order with its own state and its START. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/model_io.h"
#include "common/status.h"
#include "server/sequence.c"

/* Inputs INPUT, START, ACC_IN; outputs OUTPUT, ACC_OUT (the model's order). */
static atomic_int nbatches, maxrows;
/* The instance each sequence's rows ran on (test_order...: x = 10 * sequence + step), -1 none, -2 several. */
static atomic_int ran_on[16];

static int acc_execute(void *arg, int instance, const struct tensor *in, int nin, struct tensor *out, int nout,
                       char *err, size_t err_len) {
    (void)arg;
    (void)err;
    (void)err_len;
    assert_int_equal(nin, 3);
    assert_int_equal(nout, 2);
    int64_t rows = in[0].dims[0];
    atomic_fetch_add(&nbatches, 1);
    if (rows > atomic_load(&maxrows)) atomic_store(&maxrows, (int)rows);
    usleep(200); /* long enough for requests to queue up behind a run */
    for (int o = 0; o < 2; o++) {
        out[o] = in[0];
        out[o].data = malloc((size_t)rows * sizeof(float));
    }
    for (int64_t r = 0; r < rows; r++) {
        float x = ((const float *)in[0].data)[r], start = ((const float *)in[1].data)[r];
        int seq = (int)(x / 10);
        if (seq >= 0 && seq < 16) {
            int was = -1;
            if (!atomic_compare_exchange_strong(&ran_on[seq], &was, instance) && was != instance)
                atomic_store(&ran_on[seq], -2);
        }
        float acc = ((const float *)in[2].data)[r] * (1 - start) + x;
        ((float *)out[0].data)[r] = acc;
        ((float *)out[1].data)[r] = acc;
    }
    return 0;
}

struct fixture {
    struct model_config mc;
    batcher_t *b;
    sequencer_t *s;
};

static void setup(struct fixture *f, int max_batch, int instances, uint64_t idle_us) {
    char json[1024], err[512];
    snprintf(json, sizeof json,
             "{\"max_batch_size\": %d, \"sequence_batching\": {\"max_sequence_idle_microseconds\": %llu, "
             "\"control_input\": [{\"name\": \"START\", \"control\": [{\"kind\": \"CONTROL_SEQUENCE_START\", "
             "\"fp32_false_true\": [0, 1]}]}], \"state\": [{\"input_name\": \"ACC_IN\", \"output_name\": \"ACC_OUT\", "
             "\"data_type\": \"TYPE_FP32\", \"dims\": [1]}]}}",
             max_batch, (unsigned long long)idle_us);
    model_config_init(&f->mc, "acc");
    assert_int_equal(model_config_parse(&f->mc, json, strlen(json), err, sizeof err), 0);
    struct model_io ins[3] = {{.name = "INPUT", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 1}},
                              {.name = "START", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 1}},
                              {.name = "ACC_IN", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 1}}};
    struct model_io outs[2] = {{.name = "OUTPUT", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 1}},
                               {.name = "ACC_OUT", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 1}}};
    assert_int_equal(model_config_complete(&f->mc, ins, 3, outs, 2, err, sizeof err), 0);
    assert_true(f->mc.inputs[1].hidden && f->mc.inputs[2].hidden && !f->mc.inputs[0].hidden);
    assert_true(f->mc.outputs[1].hidden && !f->mc.outputs[0].hidden);
    struct instances_params ip = {.model_name = "acc", .count = instances, .max_rows = max_batch,
                                  .execute = acc_execute, .execute_noutputs = 2};
    struct batcher_params bp = {.model_name = "acc", .max_batch_size = max_batch, .dynamic_batching = 1};
    assert_int_equal(instances_create(&ip, &bp.executor, err, sizeof err), 0);
    f->b = batcher_create(&bp, err, sizeof err);
    assert_non_null(f->b);
    struct sequencer_params sp = {.config = &f->mc, .batcher = f->b, .instances = instances};
    f->s = sequencer_create(&sp, err, sizeof err);
    assert_non_null(f->s);
    atomic_store(&nbatches, 0);
    atomic_store(&maxrows, 0);
    for (int i = 0; i < 16; i++) atomic_store(&ran_on[i], -1);
}

static void teardown(struct fixture *f) {
    batcher_free(f->b);
    sequencer_free(f->s);
    model_config_clear(&f->mc);
}

/* One request: its inputs (the config's order, hidden ones for the sequencer) and answer. */
struct req {
    struct batcher_request br;
    struct sequence_item it;
    struct tensor in[3], out[2];
    float x;
    atomic_int done;
    float got;
    int status;
};

static void req_done(struct batcher_request *br) {
    struct req *q = br->user;
    q->status = br->status;
    if (!br->status) q->got = ((const float *)br->outputs[0].data)[0];
    for (int o = 0; o < br->noutputs; o++) tensor_free_data(&br->outputs[o]);
    atomic_store(&q->done, 1);
}

static int submit(struct fixture *f, struct req *q, uint64_t id, float x, int start, int end) {
    memset(q, 0, sizeof *q);
    q->x = x;
    q->in[0] = (struct tensor){.dtype = DT_FP32, .ndim = 2, .dims = {1, 1}, .data = &q->x};
    q->br = (struct batcher_request){.inputs = q->in, .ninputs = 3, .rows = 1, .outputs = q->out, .done = req_done,
                                     .user = q};
    q->it = (struct sequence_item){.id = id, .start = start, .end = end};
    return sequencer_submit(f->s, &q->it, &q->br, q->in);
}

static void wait_done(struct req *q) {
    for (int i = 0; i < 20000 && !atomic_load(&q->done); i++) usleep(500);
    assert_true(atomic_load(&q->done));
}

/* 8 sequences, each with its 6 requests all submitted before any answer:
 * each gets its running sums, sequences shared batches, and each sequence
 * ran on one instance. */
static void test_order_state_and_batches(void **state) {
    (void)state;
    struct fixture f;
    setup(&f, 4, 2, 60000000);
    enum { NS = 8, NR = 6 };
    static struct req q[NS][NR];
    for (int k = 0; k < NR; k++)
        for (int s = 0; s < NS; s++)
            assert_int_equal(submit(&f, &q[s][k], 100 + s, (float)(s * 10 + k), k == 0, k == NR - 1), 0);
    for (int s = 0; s < NS; s++) {
        float acc = 0;
        for (int k = 0; k < NR; k++) {
            wait_done(&q[s][k]);
            acc += (float)(s * 10 + k);
            assert_int_equal(q[s][k].status, 0);
            assert_true(q[s][k].got == acc);
        }
    }
    assert_true(atomic_load(&maxrows) > 1);
    assert_true(atomic_load(&nbatches) < NS * NR);
    /* Each sequence ran on one instance, its slot's: slots 0-3 on instance
     * 0, 4-7 on instance 1 (direct, max_batch_size 4); both were used. */
    int used[2] = {0, 0};
    for (int sq = 0; sq < NS; sq++) {
        int i = atomic_load(&ran_on[sq]);
        assert_true(i == 0 || i == 1);
        used[i]++;
    }
    assert_int_equal(used[0], 4);
    assert_int_equal(used[1], 4);
    struct sequencer_stats st;
    uint8_t room[16];
    sequencer_get_stats(f.s, &st, room, 16);
    assert_int_equal(st.started, NS);
    assert_int_equal(st.ended, NS);
    assert_int_equal(st.live, 0);
    teardown(&f);
}

/* One slot: a second sequence waits, with its request, until the first ends. */
static void test_waits_for_a_slot(void **state) {
    (void)state;
    struct fixture f;
    setup(&f, 1, 1, 60000000);
    struct req a0, b0, a1;
    assert_int_equal(submit(&f, &a0, 1, 1, 1, 0), 0);
    wait_done(&a0);
    assert_int_equal(submit(&f, &b0, 2, 5, 1, 1), 0);
    usleep(20000);
    assert_false(atomic_load(&b0.done));
    struct sequencer_stats st;
    uint8_t room[4];
    sequencer_get_stats(f.s, &st, room, 4);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(st.nslots, 1);
    assert_int_equal(room[0], 1);
    assert_int_equal(submit(&f, &a1, 1, 2, 0, 1), 0);
    wait_done(&a1);
    wait_done(&b0);
    assert_true(a1.got == 3 && b0.got == 5);
    teardown(&f);
}

/* An unload with a sequence still waiting for a slot answers its request
 * (STATUS_UNAVAILABLE) and frees every state. */
static void test_unload_answers_waiting_requests(void **state) {
    (void)state;
    struct fixture f;
    setup(&f, 1, 1, 60000000);
    struct req a0, b0;
    assert_int_equal(submit(&f, &a0, 1, 1, 1, 0), 0);
    wait_done(&a0);
    assert_int_equal(submit(&f, &b0, 2, 5, 1, 0), 0);
    usleep(10000);
    assert_false(atomic_load(&b0.done));
    teardown(&f);
    assert_true(atomic_load(&b0.done));
    assert_int_equal(b0.status, STATUS_UNAVAILABLE);
}

/* Refusals, each naming what was wrong. */
static void test_refusals(void **state) {
    (void)state;
    struct fixture f;
    setup(&f, 4, 1, 60000000);
    struct req r, r2;
    assert_int_equal(submit(&f, &r, 0, 1, 1, 0), STATUS_INVALID);
    assert_non_null(strstr(r.br.err, "correlation ID"));
    assert_int_equal(submit(&f, &r, 7, 1, 0, 0), STATUS_INVALID);
    assert_non_null(strstr(r.br.err, "must specify the START flag"));
    assert_int_equal(submit(&f, &r, 7, 1, 1, 0), 0);
    wait_done(&r);
    assert_int_equal(submit(&f, &r2, 7, 1, 1, 0), STATUS_INVALID);
    assert_non_null(strstr(r2.br.err, "has not ended"));
    /* Ended: a late request says so; a new START works. */
    assert_int_equal(submit(&f, &r2, 8, 2, 1, 1), 0);
    wait_done(&r2);
    assert_int_equal(submit(&f, &r, 8, 1, 0, 0), STATUS_INVALID);
    assert_non_null(strstr(r.br.err, "has ended"));
    assert_int_equal(submit(&f, &r, 8, 4, 1, 1), 0);
    wait_done(&r);
    assert_true(r.got == 4);
    teardown(&f);
}

/* A sequence idle for longer than max_sequence_idle_microseconds is
 * released; its next request says so. */
static void test_idle_release(void **state) {
    (void)state;
    struct fixture f;
    setup(&f, 4, 1, 30000);
    struct req r;
    assert_int_equal(submit(&f, &r, 7, 1, 1, 0), 0);
    wait_done(&r);
    struct sequencer_stats st;
    for (int i = 0; i < 400; i++) {
        sequencer_get_stats(f.s, &st, NULL, 0);
        if (st.idle_released) break;
        usleep(5000);
    }
    assert_int_equal(st.idle_released, 1);
    assert_int_equal(st.live, 0);
    assert_int_equal(submit(&f, &r, 7, 1, 0, 0), STATUS_INVALID);
    assert_non_null(strstr(r.br.err, "max_sequence_idle_microseconds"));
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_state_and_batches),
        cmocka_unit_test(test_waits_for_a_slot),
        cmocka_unit_test(test_unload_answers_waiting_requests),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_idle_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
