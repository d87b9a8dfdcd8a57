/* sequence.h - the sequence batcher: stateful models (Triton's
 * sequence_batching, config/model_config.h's struct model_sequence).
 *
 * A request that carries a correlation ID (the sequence_id parameter, an
 * integer or a string; sequence_start and sequence_end flags) belongs to a
 * sequence. The sequencer sits in front of the model's batcher
 * (server/batcher.h) and
 *   - admits a sequence on START into a slot (direct: max_batch_size slots
 *     per instance; oldest: max_candidate_sequences); a START that finds
 *     every slot taken waits, with its requests, for one to free;
 *   - hands the batcher one request of a sequence at a time, in arrival
 *     order, so the requests of one sequence run in order while those of
 *     different sequences share batches (each in its own row);
 *   - fills the request's control inputs (START, END, READY, CORRID with the
 *     configured data types and values) and its implicit state inputs (the
 *     sequence's last value of the paired output, or the initial state on
 *     START: zeros or the model's initial_state/ file), and keeps the state
 *     outputs it computes instead of sending them;
 *   - releases a sequence after its END request, or when it has had no
 *     request for max_sequence_idle_microseconds; a later request of a
 *     released sequence is refused (STATUS_INVALID) with a message that says
 *     which of the two happened.
 * A sequence's requests run on its slot's instance (batcher_request.pin).
 * Its state lives in the sequencer, on the host; it is freed with the
 * sequence and with the model version (an unload or a restart starts every
 * sequence afresh).
 *
 * Threads: submit from any thread; a request's done() is called once, from
 * an instance thread, the batcher's timer thread or the submitting thread
 * (a request refused after it was accepted). An idle-release thread per
 * sequencer. */
#ifndef KILN_SEQUENCE_H
#define KILN_SEQUENCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"
#include "config/model_config.h"
#include "server/batcher.h"

typedef struct sequencer sequencer_t;

struct sequencer_params {
    const struct model_config *config;  /* borrowed, outlives the sequencer; sequence.enable set */
    batcher_t *batcher;                 /* borrowed; freed after the sequencer's requests are done */
    const char *model_dir;              /* the model's folder: initial_state/ files */
    int instances;
};

/* One request's part, embedded in the submitter's request (no allocation
 * per request). Set id/sid/start/end; the rest is the sequencer's. */
struct sequence_item {
    uint64_t id;                        /* the correlation ID, or 0 with sid */
    const char *sid;                    /* a string correlation ID (borrowed until done), or NULL */
    int start, end;
    /* Private. */
    struct batcher_request *r_;
    struct tensor *inputs_;             /* r's inputs, the config's order: hidden entries are filled */
    void (*done_)(struct batcher_request *r);
    void *user_;
    struct sequencer *s_;
    struct seq *seq_;
    struct sequence_item *next_;
};

struct sequencer_stats {
    uint64_t live;                      /* sequences holding a slot */
    uint64_t waiting;                   /* started, waiting for a slot */
    uint64_t started, ended, idle_released;
    int nslots;
    const uint8_t *slot_used;           /* [nslots]: 1 when a sequence holds the slot (a snapshot) */
    uint64_t slot_requests[256];        /* requests run per slot, the first 256 slots */
};

/* NULL with err set (an initial_state file that cannot be read or does not
 * hold the state's bytes, out of memory). */
sequencer_t *sequencer_create(const struct sequencer_params *p, char *err, size_t err_len);
/* Fails the requests still waiting with STATUS_UNAVAILABLE and frees every
 * state. Call after batcher_free (no request of the sequencer running).
 * NULL is a no-op. */
void sequencer_free(sequencer_t *s);
/* Takes r (bound by kserve_request_bind: inputs is r->inputs, with the
 * hidden inputs left for the sequencer) into its sequence. Returns 0 and
 * r->done will be called once, or a negative status with r->err set and
 * done never called: STATUS_INVALID for a request with no correlation ID,
 * of more than one row, of an unknown, ended or released sequence, or a
 * second START of a live one. */
int sequencer_submit(sequencer_t *s, struct sequence_item *it, struct batcher_request *r, struct tensor *inputs);
/* Copies the counters; slot_used points into out's own room (valid until
 * the next call with out). */
void sequencer_get_stats(sequencer_t *s, struct sequencer_stats *out, uint8_t *slot_room, int room);

#endif
