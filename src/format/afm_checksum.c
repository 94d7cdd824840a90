/* Section checksums of the .afm file (afm.h: af_afm_section_hash): XXH3 over the list of the
 * XXH3 hashes of a section's 8 MiB chunks, so that the loader can hash the chunks of a large
 * section on several threads and still get the one value the writer computed on one.
 *
 * Invariant: the checksum of a section is the same whether its chunks were hashed on one thread
 * or several. */
#include "format/afm_layout.h"

#include <pthread.h>
#include <unistd.h>

uint64_t af_afm_chunks(uint64_t n) {
    return n ? (n + AF_AFM_HASH_CHUNK - 1) / AF_AFM_HASH_CHUNK : 0;
}

/* XXH3 of chunk c of the n bytes at p. */
static uint64_t chunk_hash(const uint8_t *p, uint64_t n, uint64_t c) {
    uint64_t lo = c * AF_AFM_HASH_CHUNK;
    return XXH3_64bits(p + lo, (size_t)(n - lo < AF_AFM_HASH_CHUNK ? n - lo : AF_AFM_HASH_CHUNK));
}

void af_afm_add_chunk(XXH3_state_t *s, uint64_t h) {
    uint8_t e[8];
    set64(e, h);
    XXH3_64bits_update(s, e, 8);
}

typedef struct hash_job {
    const uint8_t *p;
    uint64_t n, nchunks;
    uint8_t *list;
    int threads, id;
} hash_job;

static void *hash_chunks(void *arg) {
    const hash_job *j = arg;
    for (uint64_t c = (uint64_t)j->id; c < j->nchunks; c += (uint64_t)j->threads)
        set64(j->list + 8 * c, chunk_hash(j->p, j->n, c));
    return NULL;
}

uint64_t af_afm_section_hash(const void *p, uint64_t n) {
    uint64_t nchunks = af_afm_chunks(n);
    /* Large sections on up to 4 threads (hashing runs at the memory bandwidth one core gets),
     * their chunk hashes into a list; otherwise, or without memory for the list, one thread
     * adding each chunk's hash to the checksum as it goes (the same value). */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = nchunks >= 8 ? (int)(cpus < 1 ? 1 : cpus > 4 ? 4 : cpus) : 1;
    uint8_t *list = threads > 1 ? af_malloc((size_t)(8 * nchunks)) : NULL;
    if (list) {
        hash_job jobs[4];
        pthread_t tid[4];
        int started = 1;
        for (int t = 0; t < threads; t++) jobs[t] = (hash_job){p, n, nchunks, list, threads, t};
        for (int t = 1; t < threads; t++, started++)
            if (pthread_create(&tid[t], NULL, hash_chunks, &jobs[t])) break;
        for (int t = started; t < threads; t++) hash_chunks(&jobs[t]); /* threads that did not start */
        hash_chunks(&jobs[0]);
        for (int t = 1; t < started; t++) pthread_join(tid[t], NULL);
        uint64_t h = XXH3_64bits(list, (size_t)(8 * nchunks));
        af_free(list);
        return h;
    }
    XXH3_state_t *s = XXH3_createState();
    if (!s) return 0; /* the load then reports a checksum mismatch */
    XXH3_64bits_reset(s);
    for (uint64_t c = 0; c < nchunks; c++) af_afm_add_chunk(s, chunk_hash(p, n, c));
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

