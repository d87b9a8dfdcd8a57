/* model_ensemble.c - the ensemble_scheduling field of a model's
 * configuration: parsing, the data-flow checks that need no other model,
 * and its JSON form.
 *
 * Triton's form (config.json; config.pbtxt becomes the same JSON):
 *   "platform": "ensemble",
 *   "ensemble_scheduling": {"step": [
 *       {"model_name": "pre", "model_version": -1,
 *        "input_map": {"RAW": "IN"}, "output_map": {"PIXELS": "pix"}},
 *       {"model_name": "net", "input_map": {"x": "pix"}, "output_map": {"y": "OUT"}}]}
 * input_map: step model input -> ensemble tensor read; output_map: step
 * model output -> ensemble tensor produced. The checks against the step
 * models (they exist, their tensors, data types and shapes) are the
 * server's, at load (server/ensemble.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/config_json.h"
#include "config/model_config.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

static void map_clear(struct model_ensemble_map *m, int n) {
    for (int i = 0; m && i < n; i++) {
        free(m[i].key);
        free(m[i].value);
    }
    free(m);
}

void model_ensemble_clear(struct model_config *c) {
    for (int i = 0; c->steps && i < c->nsteps; i++) {
        struct model_ensemble_step *s = &c->steps[i];
        free(s->model_name);
        map_clear(s->input_map, s->ninput_map);
        map_clear(s->output_map, s->noutput_map);
    }
    free(c->steps);
    c->steps = NULL;
    c->nsteps = 0;
}

/* A map field of step i: {"model tensor": "ensemble tensor", ...}. */
static int parse_map(const cJSON *obj, int i, const char *what, struct model_ensemble_map **out, int *nout, char *err,
                     size_t err_len) {
    if (!obj) return 0;
    if (!cJSON_IsObject(obj))
        return INVALID("config field 'ensemble_scheduling.step[%d].%s' must be an object of tensor names", i, what);
    int n = cJSON_GetArraySize(obj);
    if (n > MODEL_ENSEMBLE_MAX_MAP)
        return INVALID("config field 'ensemble_scheduling.step[%d].%s' has %d entries; at most %d", i, what, n,
                       MODEL_ENSEMBLE_MAX_MAP);
    struct model_ensemble_map *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return STATUS_NOMEM;
    *out = m;
    const cJSON *e;
    cJSON_ArrayForEach(e, obj) {
        if (!cJSON_IsString(e) || !*e->valuestring || !e->string || !*e->string)
            return INVALID("config field 'ensemble_scheduling.step[%d].%s' must map tensor names to tensor names", i,
                           what);
        m[*nout].key = strdup(e->string);
        m[*nout].value = strdup(e->valuestring);
        if (!m[*nout].key || !m[*nout].value) return STATUS_NOMEM;
        (*nout)++;
    }
    return 0;
}

/* The step that produces ensemble tensor name (-1: none). */
static int producer(const struct model_config *c, const char *name) {
    for (int s = 0; s < c->nsteps; s++)
        for (int k = 0; k < c->steps[s].noutput_map; k++)
            if (strcmp(c->steps[s].output_map[k].value, name) == 0) return s;
    return -1;
}

/* 1 if a step's input_map reads tensor name. */
static int read_by_step(const struct model_config *c, const char *name) {
    for (int s = 0; s < c->nsteps; s++)
        for (int k = 0; k < c->steps[s].ninput_map; k++)
            if (strcmp(c->steps[s].input_map[k].value, name) == 0) return 1;
    return 0;
}

/* Every tensor produced once (by a step, or as an ensemble input), every
 * tensor read produced, every ensemble output produced by a step, and an
 * order of the steps in which each reads only what earlier ones produced
 * (no cycle). */
static int check_flow(const struct model_config *c, char *err, size_t err_len) {
    for (int s = 0; s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        for (int k = 0; k < st->noutput_map; k++) {
            const char *t = st->output_map[k].value;
            if (model_config_find_input(c, t) >= 0)
                return INVALID("ensemble '%s' step %d (model '%s'): output_map produces tensor '%s', which is an "
                               "ensemble input: every tensor is produced once", c->name, s, st->model_name, t);
            for (int s2 = 0; s2 <= s; s2++)
                for (int k2 = 0; k2 < c->steps[s2].noutput_map && (s2 < s || k2 < k); k2++)
                    if (strcmp(c->steps[s2].output_map[k2].value, t) == 0)
                        return INVALID("ensemble '%s': tensor '%s' is produced by step %d (model '%s') and by step %d "
                                       "(model '%s'): every tensor is produced once", c->name, t, s2,
                                       c->steps[s2].model_name, s, st->model_name);
        }
        for (int k = 0; k < st->ninput_map; k++) {
            const char *t = st->input_map[k].value;
            if (model_config_find_input(c, t) < 0 && producer(c, t) < 0)
                return INVALID("ensemble '%s' step %d (model '%s'): input_map reads tensor '%s' for input '%s', but "
                               "it is neither an ensemble input nor any step's output", c->name, s, st->model_name, t,
                               st->input_map[k].key);
        }
    }
    for (int i = 0; i < c->noutputs; i++)
        if (producer(c, c->outputs[i].name) < 0)
            return INVALID("ensemble '%s': output '%s' is produced by no step (no output_map names it)", c->name,
                           c->outputs[i].name);
    /* As Triton: a tensor nothing reads is a mistake in the wiring. */
    for (int i = 0; i < c->ninputs; i++)
        if (!read_by_step(c, c->inputs[i].name))
            return INVALID("ensemble '%s': input '%s' is not used (no step's input_map reads it)", c->name,
                           c->inputs[i].name);
    for (int s = 0; s < c->nsteps; s++)
        for (int k = 0; k < c->steps[s].noutput_map; k++) {
            const char *t = c->steps[s].output_map[k].value;
            if (!read_by_step(c, t) && model_config_find_output(c, t) < 0)
                return INVALID("ensemble '%s': tensor '%s' that step %d (model '%s') produces is unused (neither a "
                               "step's input nor an ensemble output)", c->name, t, s, c->steps[s].model_name);
        }
    /* Kahn's order: a step is ready once every step it reads from is placed. */
    int placed[MODEL_ENSEMBLE_MAX_STEPS] = {0}, nplaced = 0, progress = 1;
    while (progress) {
        progress = 0;
        for (int s = 0; s < c->nsteps; s++) {
            if (placed[s]) continue;
            int ready = 1;
            for (int k = 0; ready && k < c->steps[s].ninput_map; k++) {
                int p = producer(c, c->steps[s].input_map[k].value);
                if (p >= 0 && !placed[p]) ready = 0;
            }
            if (ready) placed[s] = progress = 1, nplaced++;
        }
    }
    if (nplaced == c->nsteps) return 0;
    for (int s = 0; s < c->nsteps; s++) {
        if (placed[s]) continue;
        for (int k = 0; k < c->steps[s].ninput_map; k++) {
            int p = producer(c, c->steps[s].input_map[k].value);
            if (p >= 0 && !placed[p])
                return INVALID("ensemble '%s': steps form a cycle: step %d (model '%s') reads tensor '%s', which "
                               "step %d (model '%s') produces from what step %d produces, directly or not", c->name, s,
                               c->steps[s].model_name, c->steps[s].input_map[k].value, p, c->steps[p].model_name, s);
        }
    }
    return INVALID("ensemble '%s': steps form a cycle", c->name);
}

int model_ensemble_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len) {
    if (!c->ensemble)
        return INVALID("config field 'ensemble_scheduling' needs platform \"ensemble\" (platform is '%s')", c->platform);
    if (!obj || !cJSON_IsObject(obj))
        return INVALID("ensemble '%s' must have config field 'ensemble_scheduling' (an object with 'step')", c->name);
    int64_t x;
    int r = config_get_int(obj, "max_inflight_requests", 0, 1 << 30, &x);
    if (r < 0) return INVALID("config field 'ensemble_scheduling.max_inflight_requests' must be an integer >= 0");
    if (r) c->max_inflight_requests = (int)x;
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(obj, "step");
    int n = cJSON_IsArray(steps) ? cJSON_GetArraySize(steps) : 0;
    if (n < 1 || n > MODEL_ENSEMBLE_MAX_STEPS)
        return INVALID("config field 'ensemble_scheduling.step' of ensemble '%s' must be an array of 1 to %d steps",
                       c->name, MODEL_ENSEMBLE_MAX_STEPS);
    c->steps = calloc((size_t)n, sizeof *c->steps);
    if (!c->steps) return STATUS_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, steps) {
        int i = c->nsteps++;
        struct model_ensemble_step *st = &c->steps[i];
        st->model_version = -1;
        const cJSON *mn = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "model_name") : NULL;
        if (!cJSON_IsString(mn) || !*mn->valuestring)
            return INVALID("config field 'ensemble_scheduling.step[%d].model_name' must be a model's name", i);
        if (!(st->model_name = strdup(mn->valuestring))) return STATUS_NOMEM;
        if (strcmp(st->model_name, c->name) == 0)
            return INVALID("ensemble '%s' step %d runs the ensemble itself: steps form a cycle", c->name, i);
        if ((r = config_get_int(e, "model_version", -1, INT64_MAX / 2, &x)) < 0 || (r && x == 0))
            return INVALID("config field 'ensemble_scheduling.step[%d].model_version' must be -1 (the highest "
                           "loaded) or a version >= 1", i);
        if (r) st->model_version = x;
        int rc = parse_map(cJSON_GetObjectItemCaseSensitive(e, "input_map"), i, "input_map", &st->input_map,
                           &st->ninput_map, err, err_len);
        if (!rc)
            rc = parse_map(cJSON_GetObjectItemCaseSensitive(e, "output_map"), i, "output_map", &st->output_map,
                           &st->noutput_map, err, err_len);
        if (rc) return rc;
        if (st->ninput_map == 0)
            return INVALID("ensemble '%s' step %d (model '%s') has no input_map: a step must read a tensor", c->name,
                           i, st->model_name);
        if (st->noutput_map == 0)
            return INVALID("ensemble '%s' step %d (model '%s') has no output_map: a step must produce a tensor",
                           c->name, i, st->model_name);
    }
    if (c->ninputs == 0 || c->noutputs == 0)
        return INVALID("ensemble '%s' must list its inputs and outputs (config fields 'input' and 'output'): it has "
                       "no model file to complete them from", c->name);
    for (int i = 0; i < c->ninputs + c->noutputs; i++) {
        const struct model_config_io *io = i < c->ninputs ? &c->inputs[i] : &c->outputs[i - c->ninputs];
        if (io->dtype == DT_UNDEFINED || io->ndim < 0)
            return INVALID("ensemble '%s': %s '%s' needs data_type and dims", c->name, i < c->ninputs ? "input" : "output",
                           io->name);
        if (io->reshape_ndim >= 0)
            return INVALID("ensemble '%s': %s '%s' has a reshape; an ensemble's tensors are handed over as they are",
                           c->name, i < c->ninputs ? "input" : "output", io->name);
    }
    return check_flow(c, err, err_len);
}

static cJSON *map_json(const struct model_ensemble_map *m, int n) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) cJSON_AddStringToObject(o, m[i].key, m[i].value);
    return o;
}

cJSON *model_ensemble_to_json(const struct model_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "step");
    for (int i = 0; i < c->nsteps; i++) {
        const struct model_ensemble_step *st = &c->steps[i];
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "model_name", st->model_name);
        cJSON_AddNumberToObject(s, "model_version", (double)st->model_version);
        cJSON_AddItemToObject(s, "input_map", map_json(st->input_map, st->ninput_map));
        cJSON_AddItemToObject(s, "output_map", map_json(st->output_map, st->noutput_map));
        cJSON_AddItemToArray(arr, s);
    }
    if (c->max_inflight_requests) cJSON_AddNumberToObject(o, "max_inflight_requests", c->max_inflight_requests);
    return o;
}
