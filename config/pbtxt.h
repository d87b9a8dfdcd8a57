/* pbtxt.h - protobuf text format (a Triton repository's config.pbtxt) read
 * into the JSON tree of the same message.
 *
 * The message's protobuf-c descriptor drives the reader: it knows each
 * field's type, whether it repeats, whether it is a map and which oneof it
 * belongs to; nothing here knows ModelConfig. The result uses the field names
 * of the .proto (snake_case, as Triton's config JSON and kiln's config.json
 * reader do), enums by name, maps as JSON objects.
 *
 * Threads: no shared state. */
#ifndef KILN_PBTXT_H
#define KILN_PBTXT_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct cJSON cJSON;

/* The deepest nesting of messages a text may have (the descriptors bound it
 * anyway: ModelConfig is 6 deep; this guards other messages). */
#define PBTXT_MAX_DEPTH 32

/* Parses len bytes of text (no NUL needed) as message d into *out (a JSON
 * object; the caller deletes it). file names the text in errors, which read
 * "<file>:<line>:<column>: field '<path>': <what>". Returns 0 or
 * STATUS_INVALID / STATUS_NOMEM with err set. */
int pbtxt_parse(const ProtobufCMessageDescriptor *d, const char *text, size_t len, const char *file, cJSON **out,
                char *err, size_t err_len);

/* 1 if field f is a map (a repeated XEntry message of key and value). */
int pbtxt_is_map(const ProtobufCFieldDescriptor *f);

#endif
