/* openai.h - OpenAI's embeddings API over the inference core.
 *
 * POST /v1/embeddings takes {"model", "input", "encoding_format",
 * "dimensions", "user"} as OpenAI's API does (input: a string, a list of
 * strings, a list of token ids or a list of such lists) and answers
 * {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
 * "model", "usage": {"prompt_tokens", "total_tokens"}}. GET /v1/models lists
 * the models that serve embeddings (config/model_embedding.c says how a
 * model's configuration exposes one).
 *
 * Each text is tokenized here, with the model's tokenizer.json (kernels/
 * text/tokenizer.h), and becomes a request of its own to the inference core:
 * the texts of one call and of concurrent calls batch together in the
 * model's batcher (padded to its buckets where the model has
 * sequence_padding), and the result cache keeps one entry per text, so a
 * text seen before is not computed again whichever call it comes in. Each
 * answer is pooled (mean over the text's tokens, the first or the last
 * token's vector, or the model's own sentence vector) and L2-normalised as
 * the configuration says.
 *
 * Errors are OpenAI's shape, {"error": {"message", "type", "param",
 * "code"}}, with its status codes. Nothing here knows HTTP or libevent: the
 * transport hands the body over and gets the answer's status and body back
 * through done, on the thread it named.
 *
 * Threads: every call of a request on that one thread (post brings the
 * core's completions back to it), except the tokenizing of a request whose
 * texts hold OPENAI_INLINE_TEXT_BYTES or more, which runs on one of the
 * runtime's text threads (runtime_work_queue) and comes back the same way. */
#ifndef KILN_OPENAI_H
#define KILN_OPENAI_H

#include <stddef.h>

#include "cache/cache.h"
#include "server/infer.h"
#include "server/repository.h"
#include "server/runtime.h"

/* The most texts one request may carry (OpenAI's own limit). */
#define OPENAI_MAX_INPUTS 2048

typedef struct openai_call openai_call_t;

struct openai_env {
    infer_core_t *core;
    repository_t *repo;
    void *thread;                 /* the transport's loop (server/runtime.h): completions come back to it */
    cache_redis_t *redis;         /* that thread's Redis connection, or NULL */
};

/* The answer: an HTTP status and a JSON body (malloc'd; done owns it). Called
 * exactly once per openai_embeddings, maybe before it returns. */
typedef void (*openai_done_fn)(void *ctx, int http_code, char *body, size_t len);

/* Starts an embeddings request. Returns the call while texts are being
 * computed (for openai_cancel until done is called), or NULL when done was
 * called already (an error, or every text answered from the in-process
 * cache). */
openai_call_t *openai_embeddings(const struct openai_env *env, const char *body, size_t len, openai_done_fn done,
                                 void *ctx);

/* The client went away: texts still queued are dropped. done is still
 * called, once every text has ended. */
void openai_cancel(openai_call_t *call);

/* GET /v1/models (model NULL) or /v1/models/{model}: the body and its HTTP
 * status (404 for a model that does not serve embeddings). */
char *openai_models(repository_t *repo, const char *model, int *http_code, size_t *len);

/* An error body in OpenAI's shape for an HTTP status. param and code may be
 * NULL (JSON null). */
char *openai_error_body(int http_code, const char *msg, const char *param, const char *code, size_t *len);

#endif
