/* upload.c - model files from a load request, checked and written into
 * the repository. See upload.h. */
#include "server/upload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "common/status.h"

#define MAX_PATH_BYTES 1024
#define MAX_FILES 1024

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

/* ==== paths =============================================================== */

int upload_path_check(const char *path, int64_t *version, char *err, size_t err_len) {
    size_t n = strlen(path);
    if (n == 0 || n > MAX_PATH_BYTES)
        return INVALID("parameter 'file:%.200s': the path must be 1 to %d bytes, such as 'file:1/model.onnx'", path,
                       MAX_PATH_BYTES);
    if (path[n - 1] == '/')
        return INVALID("parameter 'file:%.200s': the path has an empty component ('//' or a '/' at its end)", path);
    if (path[0] == '/')
        return INVALID("parameter 'file:%.200s': the path must be relative to the model's folder, not absolute", path);
    int64_t v = 0;
    int comps = 0;
    for (const char *c = path; *c; comps++) {
        const char *end = strchr(c, '/');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == 0)
            return INVALID("parameter 'file:%.200s': the path has an empty component ('//' or a '/' at its end)",
                           path);
        if (c[0] == '.')
            return INVALID("parameter 'file:%.200s': a path component may not start with '.' ('..', '.' and hidden "
                           "names are refused)", path);
        for (size_t i = 0; i < len; i++)
            if (c[i] == '\\' || (unsigned char)c[i] < 0x20 || c[i] == 0x7f)
                return INVALID("parameter 'file:%.200s': the path may not hold backslashes or control characters",
                               path);
        if (comps == 0) {
            int digits = len <= 18;
            for (size_t i = 0; digits && i < len; i++) digits = c[i] >= '0' && c[i] <= '9';
            if (digits) v = strtoll(c, NULL, 10);
            if (!digits || v <= 0)
                return INVALID("parameter 'file:%.200s': the path must start with a version folder, a positive "
                               "integer ('file:1/model.onnx')", path);
        }
        c += len + (end != NULL);
    }
    if (comps < 2)
        return INVALID("parameter 'file:%.200s': the path must name a file inside a version folder "
                       "('file:%s/model.onnx')", path, path);
    *version = v;
    return 0;
}

/* ==== the set ============================================================= */

/* Room for one more file whose size passes nothing: 0, or a status. */
static int set_reserve(struct upload_set *s, const char *path, size_t len, size_t max, char *err, size_t err_len) {
    int64_t v;
    int rc = upload_path_check(path, &v, err, err_len);
    if (rc) return rc;
    if (max == 0)
        return status_set(err, err_len, STATUS_TOO_LARGE,
                          "model files in a load request are off on this server (--max-model-upload-size 0)");
    if (len > max || s->bytes > max - len)
        return status_set(err, err_len, STATUS_TOO_LARGE,
                          "the model files of the load request exceed --max-model-upload-size (%zu bytes) at "
                          "'file:%.200s'", max, path);
    if (s->n == MAX_FILES)
        return status_set(err, err_len, STATUS_INVALID, "a load request may upload at most %d files", MAX_FILES);
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 4;
        struct upload_file *f = realloc(s->files, (size_t)nc * sizeof *f);
        if (!f) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        s->files = f;
        s->cap = nc;
    }
    return 0;
}

/* Takes data (malloc'd) as the next file. */
static int set_push(struct upload_set *s, const char *path, unsigned char *data, size_t len, char *err,
                    size_t err_len) {
    char *p = strdup(path);
    if (!p) {
        free(data);
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    }
    s->files[s->n++] = (struct upload_file){.path = p, .data = data, .len = len};
    s->bytes += len;
    return 0;
}

int upload_set_add(struct upload_set *s, const char *path, const unsigned char *data, size_t len, size_t max,
                   char *err, size_t err_len) {
    int rc = set_reserve(s, path, len, max, err, err_len);
    if (rc) return rc;
    unsigned char *d = malloc(len ? len : 1);
    if (!d) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    if (len) memcpy(d, data, len);
    return set_push(s, path, d, len, err, err_len);
}

int upload_set_add_base64(struct upload_set *s, const char *path, const char *b64, size_t max, char *err,
                          size_t err_len) {
    size_t n = strlen(b64), cap = n / 4 * 3 + 3, len = 0;
    /* The path first; the size once decoded (the text is in memory already,
     * under the request's own limit). */
    int rc = set_reserve(s, path, 0, max, err, err_len);
    if (rc) return rc;
    unsigned char *d = malloc(cap);
    if (!d) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    if (sodium_base642bin(d, cap, b64, n, " \t\r\n", &len, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 &&
        sodium_base642bin(d, cap, b64, n, " \t\r\n", &len, NULL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING) != 0) {
        free(d);
        return INVALID("parameter 'file:%.200s' must be the file's bytes in base64", path);
    }
    if ((rc = set_reserve(s, path, len, max, err, err_len))) {
        free(d);
        return rc;
    }
    return set_push(s, path, d, len, err, err_len);
}

void upload_set_clear(struct upload_set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->files[i].path);
        free(s->files[i].data);
    }
    free(s->files);
    memset(s, 0, sizeof *s);
}

/* ==== writing ============================================================= */

/* The folder name inside dfd, made when missing, opened without following
 * a symbolic link into *fd: 0, or a status with err set. */
static int dir_open(int dfd, const char *name, const char *path, int *fd, char *err, size_t err_len) {
    if (mkdirat(dfd, name, 0755) && errno != EEXIST)
        return status_set(err, err_len, STATUS_INTERNAL, "parameter 'file:%.200s': cannot make folder '%s': %s", path,
                          name, strerror(errno));
    *fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd >= 0) return 0;
    int e = errno;
    struct stat st;
    /* O_DIRECTORY answers ENOTDIR for a link as for a file: which it is. */
    int link = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
    return status_set(err, err_len, link || e == ELOOP || e == ENOTDIR ? STATUS_INVALID : STATUS_INTERNAL,
                      "parameter 'file:%.200s': '%s' is %s", path, name,
                      link || e == ELOOP ? "a symbolic link in the repository: refused"
                      : e == ENOTDIR     ? "not a folder"
                                         : strerror(e));
}

/* data written whole to a new file tmp in dfd, then renamed to name. */
static int file_put(int dfd, const char *name, const struct upload_file *f, char *err, size_t err_len) {
    char tmp[64];
    static unsigned counter;
    snprintf(tmp, sizeof tmp, ".upload.%ld.%u", (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int ok = fd >= 0;
    for (size_t off = 0; ok && off < f->len;) {
        ssize_t w = write(fd, f->data + off, f->len - off);
        if (w < 0 && errno == EINTR) continue;
        ok = w > 0;
        if (ok) off += (size_t)w;
    }
    int e = errno;
    if (fd >= 0 && close(fd)) ok = 0;
    if (ok && renameat(dfd, tmp, dfd, name)) {
        e = errno;
        ok = 0;
    }
    if (ok) return 0;
    if (fd >= 0) unlinkat(dfd, tmp, 0);
    return status_set(err, err_len, e == EISDIR ? STATUS_INVALID : STATUS_INTERNAL,
                      "parameter 'file:%.200s': cannot write the file: %s", f->path,
                      e == EISDIR ? "a folder of that name is there" : strerror(e));
}

static int write_one(int mfd, const struct upload_file *f, char *err, size_t err_len) {
    char p[MAX_PATH_BYTES + 1];
    snprintf(p, sizeof p, "%s", f->path);
    int dfd = dup(mfd), rc = 0;
    if (dfd < 0) return status_set(err, err_len, STATUS_INTERNAL, "cannot write model files: %s", strerror(errno));
    char *c = p;
    for (char *slash; (slash = strchr(c, '/')); c = slash + 1) {
        *slash = 0;
        int next;
        rc = dir_open(dfd, c, f->path, &next, err, err_len);
        close(dfd);
        if (rc) return rc;
        dfd = next;
    }
    rc = file_put(dfd, c, f, err, err_len);
    close(dfd);
    return rc;
}

int upload_write(const char *root, const char *model, const struct upload_set *s, char *err, size_t err_len) {
    for (int i = 0; i < s->n; i++) {
        int64_t v;
        int rc = upload_path_check(s->files[i].path, &v, err, err_len);
        if (rc) return rc;
    }
    int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) return status_set(err, err_len, STATUS_INTERNAL, "cannot open the model repository: %s", strerror(errno));
    int mfd, rc = dir_open(rfd, model, s->n ? s->files[0].path : "", &mfd, err, err_len);
    close(rfd);
    if (rc) return rc;
    for (int i = 0; !rc && i < s->n; i++) rc = write_one(mfd, &s->files[i], err, err_len);
    close(mfd);
    return rc;
}
