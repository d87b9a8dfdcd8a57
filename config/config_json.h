/* config_json.h - reading a configuration's JSON, shared by the files of
 * config/ (model_config.c, model_warmup.c). */
#ifndef KILN_CONFIG_JSON_H
#define KILN_CONFIG_JSON_H

#include <stdint.h>

typedef struct cJSON cJSON;

/* Reads integer field key of obj, a JSON number or a string (protobuf's
 * JSON form writes int64 as strings), within [lo, hi]. Returns 1 if present,
 * 0 if absent, -1 if malformed or out of range. */
int config_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out);

#endif
