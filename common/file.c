#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"

FILE *file_open_regular(const char *path, int64_t max_bytes, int64_t *size, int *status, char *err,
                        size_t err_len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *status = status_set(err, err_len, errno == ENOENT ? STATUS_NOT_FOUND : STATUS_INVALID, "cannot open '%s': %s",
                             path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        *status = status_set(err, err_len, STATUS_INVALID, "'%s' is not a regular file", path);
        return NULL;
    }
    if ((int64_t)st.st_size > max_bytes) {
        close(fd);
        *status = status_set(err, err_len, STATUS_INVALID, "'%s' is %lld bytes, over the limit of %lld", path,
                             (long long)st.st_size, (long long)max_bytes);
        return NULL;
    }
    /* A regular file: ordinary blocking reads from here on. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        *status = status_set(err, err_len, STATUS_NOMEM, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    *size = (int64_t)st.st_size;
    return f;
}

int file_read_regular(const char *path, int64_t max_bytes, char **out, size_t *len, char *err, size_t err_len) {
    *out = NULL;
    *len = 0;
    int64_t size;
    int rc;
    FILE *f = file_open_regular(path, max_bytes, &size, &rc, err, err_len);
    if (!f) return rc;
    size_t n = (size_t)size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return status_set(err, err_len, STATUS_NOMEM, "out of memory reading '%s'", path);
    }
    /* The file may have shrunk since fstat: what was read is what counts. */
    size_t got = n ? fread(buf, 1, n, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return status_set(err, err_len, STATUS_INVALID, "cannot read '%s'", path);
    }
    buf[got] = 0;
    *out = buf;
    *len = got;
    return 0;
}
