/* test_gpu_metrics.c - the NVML metrics text, against a fake NVML
 * (tests/server/fake_nvml.c, built beside this test by kernels/cuda/cuda.mk). */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/gpu_metrics.h"

static void test_two_gpus(void **state) {
    (void)state;
    char *t = gpu_metrics_text();
    assert_non_null(t);
    /* Each metric once with HELP and TYPE, one sample per GPU that reports it. */
    assert_non_null(strstr(t, "# TYPE kiln_gpu_utilization gauge\n"));
    assert_non_null(strstr(t, "kiln_gpu_utilization{gpu=\"0\",gpu_uuid=\"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"} 0.42\n"));
    assert_non_null(strstr(t, "kiln_gpu_utilization{gpu=\"1\",gpu_uuid=\"GPU-00000001-aaaa-bbbb-cccc-dddddddddddd\"} 1\n"));
    assert_non_null(strstr(t, "kiln_gpu_memory_used_bytes{gpu=\"0\",gpu_uuid=\"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"} 1073741824\n"));
    assert_non_null(strstr(t, "kiln_gpu_memory_total_bytes{gpu=\"1\",gpu_uuid=\"GPU-00000001-aaaa-bbbb-cccc-dddddddddddd\"} 150754820096\n"));
    assert_non_null(strstr(t, "kiln_gpu_temperature_celsius{gpu=\"0\",gpu_uuid=\"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"} 41\n"));
    assert_null(strstr(t, "kiln_gpu_temperature_celsius{gpu=\"1\""));
    assert_non_null(strstr(t, "kiln_gpu_power_usage_watts{gpu=\"0\",gpu_uuid=\"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"} 123.456\n"));
    assert_non_null(strstr(t, "kiln_gpu_power_limit_watts{gpu=\"1\",gpu_uuid=\"GPU-00000001-aaaa-bbbb-cccc-dddddddddddd\"} 700\n"));
    assert_non_null(strstr(t, "# TYPE kiln_gpu_energy_consumption_joules counter\n"));
    assert_non_null(strstr(t, "kiln_gpu_energy_consumption_joules{gpu=\"0\",gpu_uuid=\"GPU-00000000-aaaa-bbbb-cccc-dddddddddddd\"} 987654.321\n"));
    assert_null(strstr(t, "kiln_gpu_energy_consumption_joules{gpu=\"1\""));
    /* HELP/TYPE appear once per metric. */
    const char *p = strstr(t, "# HELP kiln_gpu_utilization ");
    assert_non_null(p);
    assert_null(strstr(p + 1, "# HELP kiln_gpu_utilization "));
    /* Every line is a comment or "name{labels} value". */
    for (char *line = t; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        if (line[0] != '#') {
            assert_true(strncmp(line, "kiln_gpu_", 9) == 0);
            assert_non_null(memchr(line, '}', (size_t)(nl - line)));
        }
        line = nl + 1;
    }
    free(t);
    /* A second call reads again and gives the same text. */
    char *t2 = gpu_metrics_text();
    assert_non_null(t2);
    assert_non_null(strstr(t2, "kiln_gpu_utilization{gpu=\"0\""));
    free(t2);
}

int main(void) {
    /* The fake NVML sits beside this binary. */
    char exe[PATH_MAX], lib[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(lib, sizeof lib, "%s/libfake_nvml.so", exe);
    if (access(lib, R_OK) != 0) {
        fprintf(stderr, "test_gpu_metrics: %s is missing (make builds it with this test)\n", lib);
        return 1;
    }
    setenv("KILN_NVML_LIBRARY", lib, 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_two_gpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
