/* bench_shm.c - shared-memory objects for `kiln bench --shared-memory`. */
#include "commands/bench_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int bench_shm_create(struct bench_shm *s, int index, size_t len) {
    memset(s, 0, sizeof *s);
    snprintf(s->region, sizeof s->region, "kiln_bench_%d_%d", (int)getpid(), index);
    snprintf(s->key, sizeof s->key, "/%s", s->region);
    int fd = shm_open(s->key, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        fprintf(stderr, "kiln bench: cannot create shared memory object %s: %s\n", s->key, strerror(errno));
        return -1;
    }
    s->len = len ? len : 1;
    void *m = ftruncate(fd, (off_t)s->len) == 0 ? mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                                 : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "kiln bench: cannot size or map shared memory object %s (%zu bytes): %s\n", s->key, s->len,
                strerror(errno));
        shm_unlink(s->key);
        s->key[0] = 0;
        return -1;
    }
    s->map = m;
    return 0;
}

void bench_shm_destroy(struct bench_shm *s) {
    if (s->map) munmap(s->map, s->len);
    if (s->key[0]) shm_unlink(s->key);
    memset(s, 0, sizeof *s);
}

char *bench_shm_register_body(const struct bench_shm *s) {
    char *b = malloc(256);
    if (b) snprintf(b, 256, "{\"key\":\"%s\",\"offset\":0,\"byte_size\":%zu}", s->key, s->len);
    return b;
}
