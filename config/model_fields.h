/* model_fields.h - the fate of every field of Triton's ModelConfig in kiln,
 * in one table, and the walk that applies it to a configuration.
 *
 * Each field a configuration may hold (config.json or config.pbtxt, top
 * level and nested) is honoured, refused at load with its name (kiln cannot
 * do what it asks and serving as if it were absent would change results or
 * resources), or accepted with one warning naming it (it cannot change
 * results). A field not in the table is not a ModelConfig field: refused.
 * The table is also the source of docs/models.md's field table, and a unit
 * test walks the protobuf-c descriptors to check every field has a fate.
 *
 * Threads: the table is constant; the walk has no shared state. */
#ifndef KILN_MODEL_FIELDS_H
#define KILN_MODEL_FIELDS_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct cJSON cJSON;

enum model_field_fate { MODEL_FIELD_HONOURED, MODEL_FIELD_REFUSED, MODEL_FIELD_WARNED };

/* The field is kiln's own (not in ModelConfig; config.json only). */
#define MODEL_FIELD_KILN 1u
/* A repeated field kiln honours with one element only (instance_group). */
#define MODEL_FIELD_ONE 2u

struct model_field {
    const char *path;           /* proto field names joined by '.'; a map's value fields follow the map's name */
    enum model_field_fate fate;
    unsigned flags;             /* MODEL_FIELD_* */
    /* Refused or warned fields: the one value that is honoured all the same
     * (default_model_filename "model.onnx"). Maps: the keys honoured (space-separated),
     * other keys warned (parameters). NULL: none. */
    const char *ok;
    const char *why;            /* the reason (refused, warned) or what kiln does (honoured) */
};

/* The table, n entries, in ModelConfig's order. */
const struct model_field *model_fields(size_t *n);
/* The entry for a dotted path, or NULL. */
const struct model_field *model_field_find(const char *path);
/* ModelConfig's descriptor. */
const ProtobufCMessageDescriptor *model_fields_descriptor(void);

/* Renames root's keys written as protobuf's JSON names (lowerCamelCase,
 * maxBatchSize) to the .proto's (max_batch_size), at every level, map keys
 * untouched; a key already present in snake_case wins. */
void model_fields_snake_case(cJSON *root);

/* Walks the configuration root (the JSON tree of config.json or
 * config.pbtxt) against the table. A scalar at its default value (0,
 * false, "", an enum's zero value, []) says nothing and is passed over.
 * Returns STATUS_INVALID naming the first refused or unknown field; each
 * warned field appends one line to *warnings (malloc'd, '\n' between
 * lines; the caller frees it; NULL when there is none). */
int model_fields_check(const cJSON *root, char **warnings, char *err, size_t err_len);

#endif
