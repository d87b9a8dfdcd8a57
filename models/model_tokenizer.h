/* model_tokenizer.h - the tokenizer model kind (model_params.tokenizer):
 * its graph of one node, its file and its run. For models/model.c. */
#ifndef KILN_MODEL_TOKENIZER_H
#define KILN_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"
#include "kernels/text/tokenizer.h"

#define MODEL_TOKENIZER_NOUT 3 /* input_ids, attention_mask, token_type_ids */

struct graph;

/* The graph: inputs TEXT (and TEXT_PAIR when pair), STRING [-1] or, when
 * batched, [-1, 1]; outputs INT64 [-1, -1]. NULL when out of memory. */
struct graph *model_tokenizer_graph(int pair, int batched);
/* Reads and loads a tokenizer.json (max_length: tokenizer_params'). */
struct tokenizer *model_tokenizer_load(const char *path, int64_t max_length, char *err, size_t err_len);
/* Checks one request's input (named name) before it is batched: every
 * text UTF-8, so that no text fails the run of a whole batch. 0 or
 * STATUS_INVALID naming the input and the row. */
int model_tokenizer_check(const struct tensor *t, const char *name, char *err, size_t err_len);
/* Encodes every text of inputs[0] (with inputs[1]'s as pairs) into the
 * three outputs, [rows, longest], padded. max_bytes: the run's bound on
 * what the outputs take (0: none). 0 or a status with err set; on error
 * no output is left allocated. */
int model_tokenizer_run(const struct tokenizer *t, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                        size_t max_bytes, char *err, size_t err_len);

#endif
