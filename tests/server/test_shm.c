/* test_shm.c - the registry of system shared-memory regions (server/shm.c)
 * and a request's tensors in them (server/infer_shm.c): what register
 * refuses, what acquire refuses, that a reference keeps a mapping alive past
 * its unregister and that the last one unmaps it, an object shrunk under a
 * region, threads acquiring while another registers and unregisters, and
 * inputs and outputs of a parsed request resolved and written with their
 * checks. Real POSIX shared-memory objects, made here. CUDA regions: what
 * register refuses before any device is touched (base64, handle length,
 * byte_size, device_id, a name taken by a system region), the refusal
 * naming why when no GPU is usable, and status/unregister keeping the two
 * kinds apart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/model_config.h"
#include "kernels/plugin.h"
#include "server/infer_shm.h"
#include "server/kserve.h"
#include "server/shm.h"

/* The registry as a server started with --allow-client-shm makes it; the
 * calls below act for one owner, as one connection would. */
static const struct shm_params ALLOW = {.allow = 1};
#define ME ((shm_owner_t)0x1000)

/* A shared-memory object of size bytes holding 0, 1, 2... (mod 251), with a
 * key unique to this process; the caller unlinks it. */
static void make_object(char *key, size_t key_len, const char *tag, size_t size) {
    snprintf(key, key_len, "/kiln_unit_%s_%d", tag, (int)getpid());
    int fd = shm_open(key, O_CREAT | O_RDWR | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    for (size_t i = 0; i < size; i++) p[i] = (unsigned char)(i % 251);
    munmap(p, size);
    close(fd);
}

/* Lines of /proc/self/maps that map key's object. */
static int mappings_of(const char *key) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, key + 1)) n++;
    fclose(f);
    return n;
}

static void test_register_refusals(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "refuse", 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "a", key, 0, 4096, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, ME, "a", key, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "'a' already in manager"));
    assert_int_equal(shm_register(reg, ME, "b", "/kiln_unit_no_such_object", 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "cannot open shared memory object '/kiln_unit_no_such_object'"));
    assert_int_equal(shm_register(reg, ME, "b", key, 4090, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "offset 4090 + byte_size 16 is outside shared memory object"));
    assert_int_equal(shm_register(reg, ME, "b", key, UINT64_MAX - 4, 16, err, sizeof err), STATUS_INVALID);
    assert_int_equal(shm_register(reg, ME, "b", key, 0, 0, err, sizeof err), STATUS_INVALID);
    assert_int_equal(shm_register(reg, ME, "", key, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_int_equal(shm_register(reg, ME, "b", "", 0, 16, err, sizeof err), STATUS_INVALID);
    assert_int_equal(shm_count(reg), 1);
    assert_int_equal(mappings_of(key), 1); /* the refused ones left nothing mapped */
    shm_registry_free(reg);
    assert_int_equal(mappings_of(key), 0);
    shm_unlink(key);
}

static void test_status(void **state) {
    char key[64], err[512];
    int status = 0;
    make_object(key, sizeof key, "status", 8192);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    cJSON *a = shm_status_json(reg, ME, NULL, &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 0);
    cJSON_Delete(a);
    assert_int_equal(shm_register(reg, ME, "one", key, 100, 200, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, ME, "two", key, 0, 8192, err, sizeof err), 0);
    a = shm_status_json(reg, ME, "", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 2);
    cJSON_Delete(a);
    a = shm_status_json(reg, ME, "one", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    cJSON *o = cJSON_GetArrayItem(a, 0);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(o, "key")), key);
    assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "offset")), 100);
    assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "byte_size")), 200);
    cJSON_Delete(a);
    shm_unregister(reg, ME, "one");
    shm_unregister(reg, ME, "one"); /* not registered: nothing happens */
    assert_null(shm_status_json(reg, ME, "one", &status, err, sizeof err));
    assert_int_equal(status, STATUS_NOT_FOUND);
    assert_non_null(strstr(err, "Unable to find system shared memory region: 'one'"));
    shm_unregister_all(reg, ME);
    assert_int_equal(shm_count(reg), 0);
    assert_int_equal(mappings_of(key), 0);
    shm_registry_free(reg);
    shm_unlink(key);
}

static void test_acquire(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "acquire", 3 * 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    /* Not on a page boundary: mmap's offset is rounded down, the region is not. */
    assert_int_equal(shm_register(reg, ME, "r", key, 4099, 5000, err, sizeof err), 0);
    void *addr = NULL;
    struct shm_region *r = shm_acquire(reg, ME, "r", 10, 100, "input 'x'", &addr, err, sizeof err);
    assert_non_null(r);
    assert_int_equal(((unsigned char *)addr)[0], (4099 + 10) % 251);
    assert_null(shm_acquire(reg, ME, "nope", 0, 1, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "input 'x': shared memory region 'nope' is not registered"));
    assert_null(shm_acquire(reg, ME, "r", 4990, 11, "output 'y'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "output 'y': Invalid offset + byte size for shared memory region 'r': "
                                "shared_memory_offset 4990 + shared_memory_byte_size 11 is outside its 5000 bytes"));
    assert_null(shm_acquire(reg, ME, "r", UINT64_MAX, 2, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "input 'x': Invalid offset for shared memory region 'r'"));
    assert_null(shm_acquire(reg, ME, "r", 1, UINT64_MAX, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "input 'x': Integer overflow detected: byte_size "));
    assert_non_null(shm_acquire(reg, ME, "r", 5000, 0, "input 'x'", &addr, err, sizeof err));
    assert_null(shm_acquire(reg, ME, "r", 5000, 1, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "input 'x': Invalid offset for shared memory region 'r'"));
    shm_region_release(r); /* the empty one's reference */
    r = shm_acquire(reg, ME, "r", 0, 5000, "input 'x'", &addr, err, sizeof err);
    /* Unregistered while held: still mapped and readable, gone with the reference. */
    shm_unregister(reg, ME, "r");
    assert_int_equal(shm_count(reg), 0);
    assert_int_equal(mappings_of(key), 1);
    assert_int_equal(((unsigned char *)addr)[4999], (4099 + 4999) % 251);
    assert_null(shm_acquire(reg, ME, "r", 0, 1, "input 'x'", &addr, err, sizeof err));
    shm_region_release(r);
    assert_int_equal(mappings_of(key), 1); /* the other reference */
    shm_region_release(r);
    assert_int_equal(mappings_of(key), 0);
    shm_region_release(NULL);
    shm_registry_free(reg);
    shm_unlink(key);
}

static void test_shrunk_object(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "shrunk", 8192);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "r", key, 0, 8192, err, sizeof err), 0);
    int fd = shm_open(key, O_RDWR, 0);
    assert_int_equal(ftruncate(fd, 100), 0);
    close(fd);
    void *addr;
    assert_null(shm_acquire(reg, ME, "r", 0, 16, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "is smaller than when it was registered"));
    shm_registry_free(reg);
    shm_unlink(key);
}

/* ---- threads ------------------------------------------------------------- */

struct race {
    shm_registry_t *reg;
    const char *key;
    int stop;
    long reads, bad;
};

static void *acquirer(void *arg) {
    struct race *rc = arg;
    char err[512];
    while (!__atomic_load_n(&rc->stop, __ATOMIC_ACQUIRE)) {
        void *addr;
        struct shm_region *r = shm_acquire(rc->reg, ME, "hot", 0, 256, "input 'x'", &addr, err, sizeof err);
        if (!r) continue;
        unsigned sum = 0;
        for (int i = 0; i < 256; i++) sum += ((volatile unsigned char *)addr)[i];
        if (sum != 250 * 251 / 2 + 4 * 5 / 2) __atomic_fetch_add(&rc->bad, 1, __ATOMIC_RELAXED); /* 0..250, 0..4 */
        __atomic_fetch_add(&rc->reads, 1, __ATOMIC_RELAXED);
        shm_region_release(r);
    }
    return NULL;
}

static void test_threads(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "threads", 4096);
    struct race rc = {.reg = shm_registry_create(&ALLOW), .key = key};
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, acquirer, &rc);
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(shm_register(rc.reg, ME, "hot", key, 0, 4096, err, sizeof err), 0);
        /* Now and then, wait until the readers got the region at least once. */
        long seen = __atomic_load_n(&rc.reads, __ATOMIC_RELAXED);
        for (int w = 0; i % 200 == 0 && w < 10000 && __atomic_load_n(&rc.reads, __ATOMIC_RELAXED) == seen; w++)
            usleep(100);
        if (i % 2) shm_unregister(rc.reg, ME, "hot");
        else shm_unregister_all(rc.reg, ME);
    }
    __atomic_store_n(&rc.stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    assert_true(rc.reads > 0);
    assert_int_equal(rc.bad, 0);
    assert_int_equal(mappings_of(key), 0);
    shm_registry_free(rc.reg);
    shm_unlink(key);
}

/* ---- a request's tensors ------------------------------------------------- */

static void parse(struct kserve_request *r, const char *json) {
    char err[512];
    int rc = kserve_request_parse(r, json, strlen(json), -1, err, sizeof err);
    if (rc) fail_msg("parse: %s", err);
}

static void test_resolve_and_write(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "resolve", 8192);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "in", key, 0, 4096, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, ME, "out", key, 4096, 64, err, sizeof err), 0);
    struct kserve_request r;
    /* Copied out of the region, aligned or not: never used in place. */
    parse(&r, "{\"inputs\":[{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"UINT8\",\"parameters\":"
              "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":4}},"
              "{\"name\":\"b\",\"shape\":[1],\"datatype\":\"INT32\",\"parameters\":"
              "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":4,\"shared_memory_offset\":4}}],"
              "\"outputs\":[{\"name\":\"y\",\"parameters\":{\"shared_memory_region\":\"out\","
              "\"shared_memory_byte_size\":8,\"shared_memory_offset\":8}}]}");
    assert_null(r.inputs[0].t.data);
    assert_int_equal(infer_shm_resolve(&r, "m", reg, ME, err, sizeof err), 0);
    assert_true(r.inputs[0].t.data != r.inputs[0].shm.addr);
    assert_true(r.inputs[1].t.data != r.inputs[1].shm.addr);
    assert_int_equal(((unsigned char *)r.inputs[0].t.data)[3], 3);
    int32_t b;
    memcpy(&b, r.inputs[1].t.data, 4);
    assert_int_equal(b, 4 | 5 << 8 | 6 << 16 | 7 << 24);
    /* An output of 2 int32 fits the 8 bytes asked for; 3 do not. */
    struct model_config_io out = {.name = "y", .dtype = DT_INT32, .ndim = 1, .dims = {2}};
    struct model_config mc = {.name = "m", .outputs = &out, .noutputs = 1};
    int32_t vals[3] = {-1, 77, 5};
    struct tensor y = {.dtype = DT_INT32, .ndim = 1, .dims = {2}, .data = vals};
    assert_int_equal(infer_shm_write_outputs(&r, &mc, &y, err, sizeof err), 0);
    assert_memory_equal((unsigned char *)r.outputs[0].shm.addr, vals, 8);
    y.dims[0] = 3;
    assert_int_equal(infer_shm_write_outputs(&r, &mc, &y, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "output 'y': shared_memory_byte_size is 8 but the output (shape [3] of INT32) needs 12"));
    shm_unregister_all(reg, ME);
    assert_int_equal(mappings_of(key), 2); /* "in" and "out", held by the request */
    kserve_request_clear(&r);
    assert_int_equal(mappings_of(key), 0);

    /* A byte size that is not the tensor's, a range outside the region. */
    assert_int_equal(shm_register(reg, ME, "in", key, 0, 16, err, sizeof err), 0);
    parse(&r, "{\"inputs\":[{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\",\"parameters\":"
              "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":12}}]}");
    assert_int_equal(infer_shm_resolve(&r, "m", reg, ME, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "input byte size mismatch for input 'a' for model 'm'. Expected 16, got 12 "
                                "(shared_memory_byte_size; shape [2,2] of FP32)"));
    kserve_request_clear(&r);
    parse(&r, "{\"inputs\":[{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\",\"parameters\":"
              "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":16,\"shared_memory_offset\":4}}]}");
    assert_int_equal(infer_shm_resolve(&r, "m", reg, ME, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "input 'a': Invalid offset + byte size for shared memory region"));
    kserve_request_clear(&r);
    shm_registry_free(reg);
    assert_int_equal(mappings_of(key), 0);
    shm_unlink(key);
}

static void test_parse_refusals(void **state) {
    struct kserve_request r;
    char err[512];
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1],\"parameters\":"
         "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":4}}]}",
         "input 'a': has both 'data' and parameters.shared_memory_region; send one"},
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"parameters\":"
         "{\"shared_memory_region\":\"\",\"shared_memory_byte_size\":4}}]}",
         "input 'a': parameters.shared_memory_region must be a non-empty string"},
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"parameters\":"
         "{\"shared_memory_region\":\"in\"}}]}",
         "input 'a': parameters.shared_memory_byte_size is missing"},
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"parameters\":"
         "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":4,\"shared_memory_offset\":-2}}]}",
         "input 'a': parameters.shared_memory_offset must be an integer >= 0"},
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],\"outputs\":[{\"name\":\"y\","
         "\"parameters\":{\"classification\":2,\"shared_memory_region\":\"o\",\"shared_memory_byte_size\":4}}]}",
         "output 'y': parameters.shared_memory_region and parameters.classification cannot both be set"},
        {"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],\"outputs\":[{\"name\":\"y\","
         "\"parameters\":{\"binary_data\":true,\"shared_memory_region\":\"o\",\"shared_memory_byte_size\":4}}]}",
         "output 'y': parameters.shared_memory_region and parameters.binary_data true cannot both be set"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(kserve_request_parse(&r, cases[i].json, strlen(cases[i].json), -1, err, sizeof err),
                         STATUS_INVALID);
        if (!strstr(err, cases[i].want)) fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].want);
    }
}

/* ---- CUDA regions: everything that needs no GPU ---------------------------- */

/* base64 of n bytes of 0: "AAAA" per 3 bytes, padded. */
static void b64_zeros(char *out, size_t n) {
    size_t i = 0;
    for (; n >= 3; n -= 3) i += (size_t)sprintf(out + i, "AAAA");
    if (n == 1) i += (size_t)sprintf(out + i, "AA==");
    if (n == 2) i += (size_t)sprintf(out + i, "AAA=");
    out[i] = 0;
}

static void test_cuda_register_refusals(void **state) {
    char key[64], err[1024], b64[128];
    unsigned char handle[SHM_CUDA_HANDLE_SIZE] = {0};
    make_object(key, sizeof key, "cudadup", 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "dup", key, 0, 4096, err, sizeof err), 0);
    static const char *bad[] = {"not base64!", "AAAAA", "AA=A", "AAA===", "\x01\x02"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(shm_cuda_register_b64(reg, ME, "g", bad[i], 0, 1024, err, sizeof err), STATUS_INVALID);
        assert_non_null(strstr(err, "cuda shared memory region 'g': raw_handle.b64 is not the base64 of a 64-byte"));
    }
    b64_zeros(b64, 90);
    assert_int_equal(shm_cuda_register_b64(reg, ME, "g", b64, 0, 1024, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "is not the base64 of a 64-byte CUDA IPC handle"));
    b64_zeros(b64, 65);
    assert_int_equal(shm_cuda_register_b64(reg, ME, "g", b64, 0, 1024, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "raw_handle is 65 bytes"));
    b64_zeros(b64, 32);
    assert_int_equal(shm_cuda_register_b64(reg, ME, "g", b64, 0, 1024, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "raw_handle is 32 bytes, but a CUDA IPC handle (cudaIpcMemHandle_t) is 64"));
    assert_int_equal(shm_cuda_register(reg, ME, "g", handle, 63, 0, 1024, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "raw_handle is 63 bytes"));
    assert_int_equal(shm_cuda_register(reg, ME, "g", handle, 0, 0, 1024, err, sizeof err), STATUS_INVALID);
    assert_int_equal(shm_cuda_register(reg, ME, "g", handle, sizeof handle, 0, 0, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "cuda shared memory region 'g': byte_size must be more than 0"));
    assert_int_equal(shm_cuda_register(reg, ME, "g", handle, sizeof handle, -1, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "device_id -1 is not a device number"));
    assert_int_equal(shm_cuda_register(reg, ME, "", handle, sizeof handle, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "needs a name"));
    /* Names are unique across both kinds. */
    b64_zeros(b64, 64);
    assert_int_equal(shm_cuda_register_b64(reg, ME, "dup", b64, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "shared memory region 'dup' already in manager"));
    /* Padding is optional (the name's refusal comes after the base64's). */
    b64[strlen(b64) - 2] = 0;
    assert_int_equal(shm_cuda_register_b64(reg, ME, "dup", b64, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "shared memory region 'dup' already in manager"));
    /* A last character with unused bits set is not canonical base64. */
    b64[strlen(b64) - 1] = 'B';
    assert_int_equal(shm_cuda_register_b64(reg, ME, "dup", b64, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "raw_handle.b64 is not the base64 of a 64-byte"));
    b64_zeros(b64, 64);
    /* A well-formed request: refused with the probe's reason without a GPU,
     * or (on a GPU machine) because 64 zero bytes are no process's handle. */
    char why[512] = "";
    int ndev = plugin_cuda_probe(why, sizeof why);
    int rc = shm_cuda_register_b64(reg, ME, "g", b64, 0, 16, err, sizeof err);
    if (ndev <= 0) {
        assert_int_equal(rc, STATUS_UNSUPPORTED);
        assert_non_null(strstr(err, "cuda shared memory region 'g' cannot be registered: this server has no usable GPU"));
        assert_non_null(strstr(err, why));
    } else {
        assert_int_equal(rc, STATUS_INVALID);
        assert_non_null(strstr(err, "cannot open its CUDA IPC handle on device 0"));
        assert_int_equal(shm_cuda_register(reg, ME, "g", handle, sizeof handle, ndev, 16, err, sizeof err),
                         STATUS_INVALID);
        assert_non_null(strstr(err, "does not exist"));
    }
    assert_int_equal(shm_count(reg), 1);
    shm_registry_free(reg);
    assert_int_equal(mappings_of(key), 0);
    shm_unlink(key);
}

static void test_cuda_status_and_unregister(void **state) {
    char key[64], err[512];
    int status = 0;
    make_object(key, sizeof key, "cudastatus", 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "sys", key, 0, 4096, err, sizeof err), 0);
    cJSON *a = shm_cuda_status_json(reg, ME, NULL, &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 0); /* the system region is not listed */
    cJSON_Delete(a);
    a = shm_cuda_status_json(reg, ME, "", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 0);
    cJSON_Delete(a);
    assert_null(shm_cuda_status_json(reg, ME, "sys", &status, err, sizeof err));
    assert_int_equal(status, STATUS_NOT_FOUND);
    assert_non_null(strstr(err, "Unable to find cuda shared memory region: 'sys'"));
    assert_null(shm_cuda_status_json(reg, ME, "nope", &status, err, sizeof err));
    assert_non_null(strstr(err, "Unable to find cuda shared memory region: 'nope'"));
    /* CUDA unregister leaves system regions alone, and the reverse. */
    shm_cuda_unregister(reg, ME, "sys");
    shm_cuda_unregister(reg, ME, "nope");
    shm_cuda_unregister(reg, ME, NULL);
    shm_cuda_unregister_all(reg, ME);
    assert_int_equal(shm_count(reg), 1);
    a = shm_status_json(reg, ME, "sys", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(a), 1);
    cJSON_Delete(a);
    shm_unregister_all(reg, ME);
    assert_int_equal(shm_count(reg), 0);
    shm_registry_free(reg);
    shm_unlink(key);
}

/* ---- confinement: off by default, owners, bounds, what may be opened ------ */

static void test_off_by_default(void **state) {
    char key[64], err[512];
    unsigned char handle[SHM_CUDA_HANDLE_SIZE] = {0};
    make_object(key, sizeof key, "off", 4096);
    shm_registry_t *reg = shm_registry_create(NULL);
    assert_false(shm_allowed(reg));
    assert_int_equal(shm_register(reg, ME, "a", key, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_string_equal(err, SHM_DISABLED_MSG);
    assert_int_equal(shm_cuda_register(reg, ME, "g", handle, sizeof handle, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_string_equal(err, SHM_DISABLED_MSG);
    void *addr;
    assert_null(shm_acquire(reg, ME, "a", 0, 16, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "input 'x' names shared memory region 'a', but Client shared memory is disabled"));
    assert_int_equal(mappings_of(key), 0);
    shm_registry_free(reg);
    shm_unlink(key);
}

static void test_owners(void **state) {
    char key[64], err[512];
    int status = 0;
    const shm_owner_t a = 0x2000, b = 0x3000;
    make_object(key, sizeof key, "owners", 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    /* The same name for two owners: two regions, each seen by its owner only. */
    assert_int_equal(shm_register(reg, a, "input0", key, 0, 16, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, b, "input0", key, 16, 32, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, a, "only_a", key, 0, 8, err, sizeof err), 0);
    cJSON *l = shm_status_json(reg, b, NULL, &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(l), 1);
    assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(l, 0), "offset")), 16);
    cJSON_Delete(l);
    assert_null(shm_status_json(reg, b, "only_a", &status, err, sizeof err));
    assert_int_equal(status, STATUS_NOT_FOUND);
    void *addr;
    assert_null(shm_acquire(reg, b, "only_a", 0, 8, "input 'x'", &addr, err, sizeof err));
    assert_non_null(strstr(err, "'only_a' is not registered"));
    struct shm_region *r = shm_acquire(reg, b, "input0", 0, 32, "input 'x'", &addr, err, sizeof err);
    assert_non_null(r);
    assert_int_equal(*(unsigned char *)addr, 16);
    shm_region_release(r);
    /* b's unregister, one or all, leaves a's regions. */
    shm_unregister(reg, b, "only_a");
    shm_unregister_all(reg, b);
    assert_int_equal(shm_count(reg), 2);
    l = shm_status_json(reg, a, "", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(l), 2);
    cJSON_Delete(l);
    /* A closed connection takes its regions, of both kinds, and no others. */
    assert_int_equal(shm_register(reg, b, "input0", key, 0, 16, err, sizeof err), 0);
    shm_drop_owner(reg, a);
    assert_int_equal(shm_count(reg), 1);
    l = shm_status_json(reg, b, "", &status, err, sizeof err);
    assert_int_equal(cJSON_GetArraySize(l), 1);
    cJSON_Delete(l);
    shm_drop_owner(reg, b);
    assert_int_equal(shm_count(reg), 0);
    assert_int_equal(mappings_of(key), 0);
    shm_registry_free(reg);
    shm_unlink(key);
}

static void test_bounds(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "bounds", 3 * 4096);
    const struct shm_params p = {.allow = 1, .max_regions = 3, .max_regions_per_owner = 2, .max_bytes = 8208};
    shm_registry_t *reg = shm_registry_create(&p);
    assert_int_equal(shm_max_bytes(reg), 8208);
    assert_int_equal(shm_register(reg, 1, "a", key, 0, 4096, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, 1, "b", key, 0, 16, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, 1, "c", key, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "this client holds 2 regions, its limit (--shm-max-regions-per-client)"));
    assert_int_equal(shm_register(reg, 2, "a", key, 0, 8192, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "its 8192 bytes with the 4112 registered would pass the server's limit of 8208"));
    assert_int_equal(shm_register(reg, 2, "a", key, 0, 4096, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, 3, "a", key, 0, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "the server holds 3 regions, its limit (--shm-max-regions)"));
    assert_int_equal(mappings_of(key), 3); /* the refused ones mapped nothing */
    /* Unregistering gives the room back. */
    shm_unregister(reg, 1, "a");
    assert_int_equal(shm_register(reg, 3, "a", key, 0, 4096, err, sizeof err), 0);
    shm_registry_free(reg);
    shm_unlink(key);
}

/* err names key; the same text with key replaced by "K". */
static void without_key(char *err, const char *key) {
    char *at = strstr(err, key);
    assert_non_null(at);
    memmove(at + 1, at + strlen(key), strlen(at + strlen(key)) + 1);
    *at = 'K';
}

static void test_what_may_be_opened(void **state) {
    char key[64], err[512], want[512], path[128];
    make_object(key, sizeof key, "open", 4096);
    const struct shm_params p = {.allow = 1, .key_prefix = "kiln_unit_"};
    shm_registry_t *reg = shm_registry_create(&p);
    /* Keys that are not one name. */
    static const char *bad[] = {"/a/b", "a/", "/", "/..", "."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(shm_register(reg, ME, "r", bad[i], 0, 16, err, sizeof err), STATUS_INVALID);
        assert_non_null(strstr(err, "cannot register shared memory region 'r' - invalid shm key"));
    }
    /* Triton's Python backend's prefix, behind any number of slashes. */
    static const char *reserved[] = {"triton_python_backend_shm_region_x", "/triton_python_backend_shm_region_x",
                                     "///triton_python_backend_shm_region_"};
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
        assert_int_equal(shm_register(reg, ME, "r", reserved[i], 0, 16, err, sizeof err), STATUS_INVALID);
        snprintf(want, sizeof want, "cannot register shared memory region 'r' with key '%s' as the key contains the "
                 "reserved prefix 'triton_python_backend_shm_region_'", reserved[i]);
        assert_string_equal(err, want);
    }
    char longname[SHM_NAME_MAX + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(shm_register(reg, ME, longname, key, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "the name is longer than 1024 bytes"));
    longname[SHM_NAME_MAX] = 0; /* 1024: fine */
    assert_int_equal(shm_register(reg, ME, longname, key, 0, 16, err, sizeof err), 0);
    shm_unregister(reg, ME, longname);
    char longkey[SHM_KEY_MAX + 8];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    assert_int_equal(shm_register(reg, ME, "r", longkey, 0, 16, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "'key' is longer than 255 bytes"));
    /* With and without the leading '/', inside the prefix: registered. */
    assert_int_equal(shm_register(reg, ME, "r1", key, 0, 16, err, sizeof err), 0);
    assert_int_equal(shm_register(reg, ME, "r2", key + 1, 0, 16, err, sizeof err), 0);
    /* No such object: the message every refusal below must repeat. */
    char missing[64];
    snprintf(missing, sizeof missing, "/kiln_unit_missing_%d", (int)getpid());
    assert_int_equal(shm_register(reg, ME, "r", missing, 0, 16, err, sizeof err), STATUS_INVALID);
    without_key(err, missing);
    snprintf(want, sizeof want, "%s", err);
    assert_non_null(
        strstr(want, "cannot open shared memory object 'K': it does not exist or is not the server's to open"));
    /* Outside the prefix (an object that exists). */
    char other[64];
    snprintf(other, sizeof other, "/kiln_UNIT_x_%d", (int)getpid()); /* another prefix */
    int fd = shm_open(other, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0 && ftruncate(fd, 4096) == 0);
    close(fd);
    assert_int_equal(shm_register(reg, ME, "r", other, 0, 16, err, sizeof err), STATUS_INVALID);
    without_key(err, other);
    assert_string_equal(err, want);
    shm_unlink(other);
    /* A symbolic link to our own object, and a directory. */
    char link[64];
    snprintf(link, sizeof link, "/kiln_unit_link_%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm%s", link);
    char target[128];
    snprintf(target, sizeof target, "/dev/shm%s", key);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(shm_register(reg, ME, "r", link, 0, 16, err, sizeof err), STATUS_INVALID);
    without_key(err, link);
    assert_string_equal(err, want);
    unlink(path);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(shm_register(reg, ME, "r", link, 0, 16, err, sizeof err), STATUS_INVALID);
    without_key(err, link);
    assert_string_equal(err, want);
    rmdir(path);
    /* Another user's object (only root can make one to test with). */
    if (geteuid() == 0) {
        snprintf(path, sizeof path, "/dev/shm%s", key);
        assert_int_equal(chown(path, 65534, 65534), 0);
        assert_int_equal(shm_register(reg, ME, "r", key, 0, 16, err, sizeof err), STATUS_INVALID);
        without_key(err, key);
        assert_string_equal(err, want);
    }
    assert_int_equal(shm_count(reg), 2);
    shm_registry_free(reg);
    shm_unlink(key);
}

/* ---- the SIGBUS guard ------------------------------------------------------- */

static void test_truncated_during_copy(void **state) {
    char key[64], err[512];
    make_object(key, sizeof key, "bus", 3 * 4096);
    shm_registry_t *reg = shm_registry_create(&ALLOW);
    assert_int_equal(shm_register(reg, ME, "r", key, 0, 3 * 4096, err, sizeof err), 0);
    void *addr;
    struct shm_region *r = shm_acquire(reg, ME, "r", 0, 3 * 4096, "input 'x'", &addr, err, sizeof err);
    assert_non_null(r);
    /* Truncated after the acquire's check: the copies fault, and say so. */
    int fd = shm_open(key, O_RDWR, 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    static unsigned char buf[3 * 4096];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(shm_region_read(r, addr, buf, sizeof buf, err, sizeof err), STATUS_INVALID);
        assert_non_null(strstr(err, "shared memory region 'r': shared memory object"));
        assert_non_null(strstr(err, "was truncated while the request read from it"));
        assert_int_equal(shm_region_write(r, addr, buf, sizeof buf, err, sizeof err), STATUS_INVALID);
        assert_non_null(strstr(err, "was truncated while the request wrote into it"));
    }
    /* The part still backed copies as before; grown again, all of it does. */
    assert_int_equal(shm_region_read(r, addr, buf, 4096, err, sizeof err), 0);
    assert_int_equal(buf[4095], 4095 % 251);
    assert_int_equal(ftruncate(fd, 3 * 4096), 0);
    assert_int_equal(shm_region_read(r, addr, buf, sizeof buf, err, sizeof err), 0);
    close(fd);
    /* A fault outside a guarded copy is still fatal (in a child, where the
     * guard goes over the default action rather than over cmocka's handler,
     * which the registry above found in place and passes such faults to). */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGBUS, SIG_DFL);
        shm_registry_free(shm_registry_create(&ALLOW));
        int f = shm_open(key, O_RDWR, 0);
        if (f < 0 || ftruncate(f, 0) != 0) _exit(3);
        volatile unsigned char *p = addr;
        _exit(p[100]);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS);
    shm_region_release(r);
    shm_registry_free(reg);
    shm_unlink(key);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_refusals), cmocka_unit_test(test_status),
        cmocka_unit_test(test_acquire),           cmocka_unit_test(test_shrunk_object),
        cmocka_unit_test(test_threads),           cmocka_unit_test(test_resolve_and_write),
        cmocka_unit_test(test_parse_refusals),    cmocka_unit_test(test_cuda_register_refusals),
        cmocka_unit_test(test_cuda_status_and_unregister),
        cmocka_unit_test(test_off_by_default),    cmocka_unit_test(test_owners),
        cmocka_unit_test(test_bounds),            cmocka_unit_test(test_what_may_be_opened),
        cmocka_unit_test(test_truncated_during_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
