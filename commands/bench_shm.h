/* bench_shm.h - `kiln bench --shared-memory`: request inputs placed in POSIX
 * shared-memory objects that the bench registers with the server (Triton's
 * system shared-memory extension), so each request carries only its JSON
 * header. One object per distinct request body, created, registered and
 * removed again by the bench; the server must be on the same machine. */
#ifndef KILN_BENCH_SHM_H
#define KILN_BENCH_SHM_H

#include <stddef.h>

struct bench_shm {
    char region[64];   /* the region's name at the server */
    char key[64];      /* the object's shm_open name */
    void *map;
    size_t len;
};

/* Creates and maps object number index of len bytes (its name has the
 * process id in it). 0, or -1 with a message on stderr. */
int bench_shm_create(struct bench_shm *s, int index, size_t len);
/* Unmaps and removes the object; s zeroed is a no-op. */
void bench_shm_destroy(struct bench_shm *s);
/* The register request's JSON body for s (malloc'd). */
char *bench_shm_register_body(const struct bench_shm *s);

#endif
