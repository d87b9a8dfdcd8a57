/* test_graph.c - graph IR: name index, nodes, toposort, attributes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "graph/graph.h"

static void test_intern_and_find(void **state) {
    (void)state;
    struct graph *g = graph_create();
    assert_non_null(g);
    char name[32];
    /* Enough values to force the index and the value array to grow. */
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "v%d", i);
        assert_int_equal(graph_intern_value(g, name), i);
    }
    assert_int_equal(g->nvalues, 1000);
    assert_int_equal(graph_intern_value(g, "v517"), 517);
    assert_int_equal(graph_find_value(g, "v999"), 999);
    assert_int_equal(graph_find_value(g, "nope"), -1);
    assert_int_equal(g->values[3].t.ndim, -1);
    assert_int_equal(g->values[3].producer, -1);
    graph_free(g);
    graph_free(NULL);
}

/* Builds a -> N1 -> b -> N2 -> c with the nodes added in reverse order. */
static void test_toposort_orders(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a"), b = graph_intern_value(g, "b"), c = graph_intern_value(g, "c");
    g->values[a].flags = VALUE_INPUT;
    assert_int_equal(graph_add_node(g, "second", "Relu", "", &b, 1, &c, 1), 0);
    assert_int_equal(graph_add_node(g, "", "Neg", "", &a, 1, &b, 1), 1);
    char err[256] = "";
    assert_int_equal(graph_toposort(g, err, sizeof err), 0);
    assert_string_equal(g->nodes[0].name, "Neg_1");
    assert_string_equal(g->nodes[1].name, "second");
    assert_int_equal(g->values[b].producer, 0);
    assert_int_equal(g->values[c].producer, 1);
    assert_int_equal(g->values[a].producer, -1);
    graph_free(g);
}

static void test_toposort_cycle(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a"), b = graph_intern_value(g, "b"), c = graph_intern_value(g, "c");
    g->values[a].flags = VALUE_INPUT;
    int in1[2] = {a, c};
    graph_add_node(g, "n1", "Add", "", in1, 2, &b, 1);
    graph_add_node(g, "n2", "Relu", "", &b, 1, &c, 1);
    char err[256] = "";
    assert_int_equal(graph_toposort(g, err, sizeof err), -1);
    assert_non_null(strstr(err, "cycle"));
    assert_non_null(strstr(err, "'n1'"));
    graph_free(g);
}

static void test_toposort_missing_producer(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a"), b = graph_intern_value(g, "b");
    graph_add_node(g, "lonely", "Relu", "", &a, 1, &b, 1);
    char err[256] = "";
    assert_int_equal(graph_toposort(g, err, sizeof err), -1);
    assert_non_null(strstr(err, "'lonely'"));
    assert_non_null(strstr(err, "'a'"));
    graph_free(g);
}

static void test_toposort_double_producer(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a"), b = graph_intern_value(g, "b");
    g->values[a].flags = VALUE_INPUT;
    graph_add_node(g, "p1", "Relu", "", &a, 1, &b, 1);
    graph_add_node(g, "p2", "Neg", "", &a, 1, &b, 1);
    char err[256] = "";
    assert_int_equal(graph_toposort(g, err, sizeof err), -1);
    assert_non_null(strstr(err, "produced twice"));
    graph_free(g);
}

/* A graph without nodes (an output that is an input) sorts fine. */
static void test_toposort_empty(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a");
    g->values[a].flags = VALUE_INPUT | VALUE_OUTPUT;
    char err[256] = "";
    assert_int_equal(graph_toposort(g, err, sizeof err), 0);
    graph_free(g);
}

static void test_attrs(void **state) {
    (void)state;
    struct graph *g = graph_create();
    int a = graph_intern_value(g, "a"), b = graph_intern_value(g, "b");
    int n = graph_add_node(g, "c", "Conv", "", &a, 1, &b, 1);
    struct graph_node *node = &g->nodes[n];
    node->attrs = calloc(4, sizeof *node->attrs);
    node->nattr = 4;
    node->attrs[0] = (struct graph_attr){.name = strdup("group"), .type = ATTR_INT, .i = 2};
    node->attrs[1] = (struct graph_attr){.name = strdup("alpha"), .type = ATTR_FLOAT, .f = 0.5f};
    node->attrs[2] = (struct graph_attr){.name = strdup("auto_pad"), .type = ATTR_STRING, .s = strdup("SAME_UPPER"), .s_len = 10};
    node->attrs[3] = (struct graph_attr){.name = strdup("pads"), .type = ATTR_INTS, .n = 2};
    node->attrs[3].ints = malloc(2 * sizeof(int64_t));
    node->attrs[3].ints[0] = 1;
    node->attrs[3].ints[1] = 3;
    assert_int_equal(node_attr_int(node, "group", 1), 2);
    assert_int_equal(node_attr_int(node, "missing", 7), 7);
    assert_true(node_attr_float(node, "alpha", 0) == 0.5f);
    assert_string_equal(node_attr_str(node, "auto_pad", "NOTSET"), "SAME_UPPER");
    assert_string_equal(node_attr_str(node, "group", "x"), "x");
    const int64_t *pads;
    assert_int_equal(node_attr_ints(node, "pads", &pads), 2);
    assert_int_equal(pads[1], 3);
    const float *fl;
    assert_int_equal(node_attr_floats(node, "pads", &fl), -1);
    assert_null(fl);
    assert_null(node_attr_tensor(node, "pads"));
    graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intern_and_find),        cmocka_unit_test(test_toposort_orders),
        cmocka_unit_test(test_toposort_cycle),         cmocka_unit_test(test_toposort_missing_producer),
        cmocka_unit_test(test_toposort_double_producer), cmocka_unit_test(test_attrs), cmocka_unit_test(test_toposort_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
