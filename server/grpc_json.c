/* grpc_json.c - protobuf messages from the JSON bodies the HTTP front end
 * serves (server/http_bodies.c, model_config_to_json, repository_index).
 *
 * Triton's JSON and its protobuf messages use the same field names, so one
 * walk over a message's descriptor fills it from the JSON: metadata,
 * statistics, the model configuration and the repository index are built
 * once, and the two transports cannot disagree about them. The message tree
 * lives in a pool (grpc_codec.c) freed as a whole after packing. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/grpc_impl.h"

static size_t field_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4; /* int32, uint32, float, enum and their fixed forms */
    }
}

/* A JSON number, or a decimal string (how JSON carries 64-bit integers). */
static double json_number(const cJSON *v) {
    if (cJSON_IsString(v)) return strtod(v->valuestring, NULL);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static ProtobufCMessage *build(const ProtobufCMessageDescriptor *d, const cJSON *j, struct grpc_pool *p);

/* Writes v into the field's slot at dst. -1 when out of memory. */
static int set_value(const ProtobufCFieldDescriptor *f, void *dst, const cJSON *v, struct grpc_pool *p) {
    double x = json_number(v);
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)dst = (int32_t)x; return 0;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: *(uint32_t *)dst = (uint32_t)x; return 0;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)dst = cJSON_IsString(v) ? strtoll(v->valuestring, NULL, 10) : (int64_t)x; return 0;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)dst = cJSON_IsString(v) ? strtoull(v->valuestring, NULL, 10) : (uint64_t)x; return 0;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)dst = (float)x; return 0;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)dst = x; return 0;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)dst = x != 0; return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *e = cJSON_IsString(v)
                                          ? protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, v->valuestring)
                                          : NULL;
        *(int *)dst = e ? e->value : (int)x;
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char num[32];
        if (!cJSON_IsString(v)) snprintf(num, sizeof num, "%.17g", x);
        return (*(char **)dst = grpc_pool_strdup(p, cJSON_IsString(v) ? v->valuestring : num)) ? 0 : -1;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = dst;
        b->data = cJSON_IsString(v) ? (uint8_t *)grpc_pool_strdup(p, v->valuestring) : NULL;
        b->len = b->data ? strlen(v->valuestring) : 0;
        return cJSON_IsString(v) && !b->data ? -1 : 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
        return (*(ProtobufCMessage **)dst = build(f->descriptor, v, p)) ? 0 : -1;
    }
    return 0;
}

/* A map field (repeated XEntry {key, value}) takes a JSON object. */
static int is_map(const ProtobufCFieldDescriptor *f, const cJSON *v) {
    const ProtobufCMessageDescriptor *d = f->descriptor;
    return f->type == PROTOBUF_C_TYPE_MESSAGE && cJSON_IsObject(v) && d->n_fields == 2 &&
           strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

static ProtobufCMessage *map_entry(const ProtobufCMessageDescriptor *d, const cJSON *member, struct grpc_pool *p) {
    ProtobufCMessage *m = grpc_pool_alloc(p, d->sizeof_message);
    if (!m) return NULL;
    d->message_init(m);
    cJSON key = {.type = cJSON_String, .valuestring = member->string};
    if (set_value(&d->fields[0], (char *)m + d->fields[0].offset, &key, p) ||
        set_value(&d->fields[1], (char *)m + d->fields[1].offset, member, p))
        return NULL;
    return m;
}

static int set_repeated(const ProtobufCFieldDescriptor *f, void *msg, const cJSON *v, struct grpc_pool *p) {
    int map = is_map(f, v);
    if (!map && !cJSON_IsArray(v)) return 0;
    size_t n = (size_t)cJSON_GetArraySize(v), es = field_size(f->type), i = 0;
    char *arr = n ? grpc_pool_alloc(p, n * es) : NULL;
    if (n && !arr) return -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (map) {
            if (!(((ProtobufCMessage **)arr)[i] = map_entry(f->descriptor, e, p))) return -1;
        } else if (set_value(f, arr + i * es, e, p)) return -1;
        i++;
    }
    *(size_t *)((char *)msg + f->quantifier_offset) = n;
    *(void **)((char *)msg + f->offset) = arr;
    return 0;
}

static ProtobufCMessage *build(const ProtobufCMessageDescriptor *d, const cJSON *j, struct grpc_pool *p) {
    if (!cJSON_IsObject(j)) return NULL;
    ProtobufCMessage *m = grpc_pool_alloc(p, d->sizeof_message);
    if (!m) return NULL;
    d->message_init(m);
    const cJSON *v;
    cJSON_ArrayForEach(v, j) {
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, v->string);
        if (!f || cJSON_IsNull(v)) continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            if (set_repeated(f, m, v, p)) return NULL;
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && !cJSON_IsObject(v)) continue;
        if (set_value(f, (char *)m + f->offset, v, p)) return NULL;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
        else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
            *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
    }
    return m;
}

ProtobufCMessage *grpc_json_message(const ProtobufCMessageDescriptor *d, const cJSON *j, struct grpc_pool *p) {
    return build(d, j, p);
}

void grpc_stream_reply_json(struct grpc_stream *st, const ProtobufCMessageDescriptor *d, cJSON *j) {
    struct grpc_pool pool = {0};
    ProtobufCMessage *m = j ? build(d, j, &pool) : NULL;
    if (m) grpc_stream_reply(st, m);
    else grpc_stream_finish(st, STATUS_NOMEM, "out of memory");
    grpc_pool_free(&pool);
    cJSON_Delete(j);
}
