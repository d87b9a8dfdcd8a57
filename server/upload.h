/* upload.h - model files sent in a load request (Triton's model repository
 * extension: parameters "file:<version>/<name>", base64 over HTTP, bytes
 * over gRPC) and their writing into the model's folder of the repository.
 *
 * A file's path is checked before anything is written: relative, each
 * component a plain name (no "", ".", "..", hidden names, backslashes or
 * control bytes), the first a version number, at least a file inside it.
 * Writing opens each folder below the repository's root without following
 * a symbolic link, and puts each file in place with a rename, so that no
 * byte lands outside <root>/<model>/ whatever the folders hold.
 *
 * Plain functions: the set is owned by its caller; upload_write blocks on
 * the file system (the control thread's, never an I/O loop's). */
#ifndef KILN_UPLOAD_H
#define KILN_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

struct upload_file {
    char *path;                  /* after "file:", e.g. "1/model.onnx" */
    unsigned char *data;
    size_t len;
};

/* The files of one load request, with their total size. */
struct upload_set {
    struct upload_file *files;
    int n, cap;
    size_t bytes;
};

/* Whether path (after "file:") may be written: 0 with *version its version
 * folder, or STATUS_INVALID with err naming the parameter and the rule. */
int upload_path_check(const char *path, int64_t *version, char *err, size_t err_len);

/* Adds a copy of data[0..len) as path: 0, or a status with err set:
 * INVALID for a path upload_path_check refuses, TOO_LARGE when the set
 * would pass max bytes (0: uploads are off), NOMEM. */
int upload_set_add(struct upload_set *s, const char *path, const unsigned char *data, size_t len, size_t max,
                   char *err, size_t err_len);
/* The same with the file's bytes in base64 (RFC 4648, as HTTP's JSON carries them). */
int upload_set_add_base64(struct upload_set *s, const char *path, const char *b64, size_t max, char *err,
                          size_t err_len);
/* Frees the files; the set is empty again. */
void upload_set_clear(struct upload_set *s);

/* Writes every file of s under root/model/ (the model's folder is made
 * when missing), replacing files of the same path: 0, or a status with
 * err naming the file ("file:1/model.onnx", never an absolute path):
 * INVALID when a folder on the way is a symbolic link or not a folder,
 * INTERNAL when the file system refuses. */
int upload_write(const char *root, const char *model, const struct upload_set *s, char *err, size_t err_len);

#endif
