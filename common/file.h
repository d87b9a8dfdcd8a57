/* file.h - opening files that kiln does not control, a model repository's.
 *
 * A repository is written by someone else: its config.json may be a FIFO, a
 * device or a socket, or far larger than any configuration. Every file kiln
 * reads from it goes through file_open_regular, which opens without blocking
 * (O_NONBLOCK: a FIFO without a writer would otherwise hang the thread and,
 * behind it, the shutdown), refuses anything but a regular file and anything
 * over a size cap, and only then hands the file over for ordinary reads.
 *
 * Errors: STATUS_NOT_FOUND when the path does not exist, STATUS_INVALID when
 * it is not a regular file or is over the cap, with err naming the path.
 * Threads: no shared state. */
#ifndef KILN_FILE_H
#define KILN_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Opens path for reading if it is a regular file of at most max_bytes;
 * *size receives its size. Returns the stream (the caller closes it) or NULL
 * with *status and err set. */
FILE *file_open_regular(const char *path, int64_t max_bytes, int64_t *size, int *status, char *err,
                        size_t err_len);

/* Reads a whole regular file of at most max_bytes into a malloc'd buffer with
 * a NUL after its last byte. Returns 0 or a negative status with err set. */
int file_read_regular(const char *path, int64_t max_bytes, char **out, size_t *len, char *err, size_t err_len);

#endif
