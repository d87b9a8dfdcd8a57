/* fuzz_pbtxt.c - libFuzzer target for config.pbtxt (config/pbtxt.c): the
 * protobuf text reader driven by ModelConfig's descriptors, then what a
 * model folder's file goes through after it: the fates walk
 * (config/model_fields.c) and model_config_parse over the JSON it made.
 *
 * The input is the file's text. A text the reader refuses has an error that
 * names the file and a line:column; one it accepts prints as JSON that parses
 * back to the same tree. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c config/model_*.c config/pbtxt.c
// fuzz-corpus: tests/fuzz/corpus/pbtxt/*
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/model_config.h"
#include "config/model_fields.h"
#include "config/pbtxt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512] = "";
    cJSON *o = NULL;
    int rc = pbtxt_parse(model_fields_descriptor(), (const char *)data, size, "config.pbtxt", &o, err, sizeof err);
    if (rc) {
        int line, col;
        if (o || (rc != STATUS_NOMEM && sscanf(err, "config.pbtxt:%d:%d:", &line, &col) != 2)) abort();
        return 0;
    }
    char *json = cJSON_PrintUnformatted(o);
    if (!json) abort();
    cJSON *back = cJSON_Parse(json);
    if (!back || !cJSON_Compare(o, back, 1)) abort();
    cJSON_Delete(back);
    struct model_config c;
    model_config_init(&c, "m");
    model_config_parse(&c, json, strlen(json), err, sizeof err);
    model_config_clear(&c);
    free(json);
    cJSON_Delete(o);
    return 0;
}
