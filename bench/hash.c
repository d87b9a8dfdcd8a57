/* hash.c - throughput of the hashes the result cache could key with.
 *
 * The cache key is a keyed cryptographic hash over the model name,
 * version and every input's name, datatype, shape and bytes. This measures
 * the candidates on the input sizes that matter (a small request, a 4 KiB
 * one, a 1 MiB image batch) so the choice rests on numbers:
 *   - BLAKE2b-256 keyed (libsodium crypto_generichash): what the cache uses;
 *   - HMAC-SHA-256 (libsodium crypto_auth_hmacsha256): SHA-256 made keyed;
 *   - SHA-256 unkeyed (libsodium crypto_hash_sha256), for reference;
 *   - SHA-256 and HMAC-SHA-256 through OpenSSL's EVP, which uses the CPU's
 *     SHA extensions where it has them (built when libcrypto is present).
 *
 *   build/hash_bench [--csv FILE] [--seconds S]
 * Prints a markdown table (MB/s and ns per hash) and optionally a CSV. */
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef HAVE_OPENSSL
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

static uint8_t key[32];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef void (*hash_fn)(const uint8_t *in, size_t n, uint8_t out[32]);

static void h_blake2b_keyed(const uint8_t *in, size_t n, uint8_t out[32]) {
    crypto_generichash(out, 32, in, n, key, sizeof key);
}

static void h_hmac_sha256_sodium(const uint8_t *in, size_t n, uint8_t out[32]) {
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, sizeof key);
    crypto_auth_hmacsha256_update(&st, in, n);
    crypto_auth_hmacsha256_final(&st, out);
}

static void h_sha256_sodium(const uint8_t *in, size_t n, uint8_t out[32]) {
    crypto_hash_sha256(out, in, n);
}

#ifdef HAVE_OPENSSL
static void h_sha256_openssl(const uint8_t *in, size_t n, uint8_t out[32]) {
    unsigned int len = 32;
    EVP_Digest(in, n, out, &len, EVP_sha256(), NULL);
}

static void h_hmac_sha256_openssl(const uint8_t *in, size_t n, uint8_t out[32]) {
    unsigned int len = 32;
    HMAC(EVP_sha256(), key, (int)sizeof key, in, n, out, &len);
}
#endif

struct algo {
    const char *name;
    hash_fn fn;
};

static const struct algo ALGOS[] = {
    {"BLAKE2b-256 keyed (libsodium)", h_blake2b_keyed},
    {"HMAC-SHA-256 (libsodium)", h_hmac_sha256_sodium},
    {"SHA-256 unkeyed (libsodium)", h_sha256_sodium},
#ifdef HAVE_OPENSSL
    {"SHA-256 unkeyed (OpenSSL EVP)", h_sha256_openssl},
    {"HMAC-SHA-256 (OpenSSL)", h_hmac_sha256_openssl},
#endif
};
#define NALGOS (sizeof ALGOS / sizeof ALGOS[0])

static const size_t SIZES[] = {256, 4096, 1 << 20};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

/* Hashes repeatedly for about `seconds`, best of three rounds (the machine is
 * shared: the best round is the least disturbed one). Returns ns per hash. */
static double measure(hash_fn fn, const uint8_t *buf, size_t n, double seconds) {
    uint8_t out[32];
    volatile uint8_t sink = 0;
    /* Calibrate the iteration count to the time slice. */
    long iters = 1;
    for (;;) {
        double t0 = now_s();
        for (long i = 0; i < iters; i++) fn(buf, n, out);
        double dt = now_s() - t0;
        if (dt > seconds / 10 || iters > (1L << 30)) {
            iters = (long)((double)iters * (seconds / 3) / (dt > 0 ? dt : 1e-9)) + 1;
            break;
        }
        iters *= 4;
    }
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        double t0 = now_s();
        for (long i = 0; i < iters; i++) {
            fn(buf, n, out);
            sink ^= out[0];
        }
        double ns = (now_s() - t0) * 1e9 / (double)iters;
        if (ns < best) best = ns;
    }
    (void)sink;
    return best;
}

int main(int argc, char **argv) {
    const char *csv_path = NULL;
    double seconds = 0.5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv_path = argv[++i];
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: hash_bench [--csv FILE] [--seconds S]   (unknown argument '%s')\n", argv[i]);
            return 2;
        }
    }
    if (seconds <= 0) {
        fprintf(stderr, "hash_bench: --seconds must be positive\n");
        return 2;
    }
    if (sodium_init() < 0) {
        fprintf(stderr, "hash_bench: libsodium failed to initialize\n");
        return 1;
    }
    randombytes_buf(key, sizeof key);
    size_t maxn = SIZES[NSIZES - 1];
    uint8_t *buf = malloc(maxn);
    if (!buf) {
        fprintf(stderr, "hash_bench: out of memory\n");
        return 1;
    }
    randombytes_buf(buf, maxn);

    FILE *csv = NULL;
    if (csv_path && !(csv = fopen(csv_path, "w"))) {
        perror(csv_path);
        free(buf);
        return 1;
    }
    if (csv) fprintf(csv, "algorithm,bytes,ns_per_hash,mb_per_s\n");

    printf("| hash | 256 B: ns/hash | 256 B: MB/s | 4 KiB: ns/hash | 4 KiB: MB/s | 1 MiB: us/hash | 1 MiB: MB/s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t a = 0; a < NALGOS; a++) {
        printf("| %s", ALGOS[a].name);
        for (size_t s = 0; s < NSIZES; s++) {
            double ns = measure(ALGOS[a].fn, buf, SIZES[s], seconds);
            double mbs = (double)SIZES[s] / ns * 1e3; /* bytes/ns = GB/s; x1000 = MB/s */
            if (SIZES[s] >= (1u << 20)) printf(" | %.1f | %.0f", ns / 1e3, mbs);
            else printf(" | %.0f | %.0f", ns, mbs);
            if (csv) fprintf(csv, "%s,%zu,%.3f,%.3f\n", ALGOS[a].name, SIZES[s], ns, mbs);
            fflush(stdout);
        }
        printf(" |\n");
    }
    if (csv) fclose(csv);
    free(buf);
    return 0;
}
