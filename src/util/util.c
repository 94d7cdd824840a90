/* Arena allocator, half-float conversions and small file helpers.
 * The arena keeps a list of blocks; nothing is freed until af_arena_free, so pointers into it
 * stay valid for the arena's life, except the data blocks of constants that af_arena_sweep_data
 * frees once the compiler has replaced those constants (folded BatchNorm weights before
 * packing, say: ResNet-50's compile left three copies of its weights behind).
 *
 * Invariant: memory from an arena is zeroed and aligned as af_arena_alloc says. */
#include "util/util.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARENA_BLOCK (64 * 1024)

/* Block data starts 64-byte aligned, so large allocations (constants, packed weights) start on
 * a cache line and vector rows of them never straddle one more line than they must. */
typedef struct block {
    struct block *next;
    size_t used, size;
    bool data; /* one constant's data, alone in its block (af_arena_alloc_data) */
    _Alignas(64) unsigned char data_bytes[];
} block;

struct af_arena {
    block *head;
};

static void free_block(block *b) {
    if (b->data) af_free_pages(b, sizeof(block) + b->size);
    else af_free(b);
}

af_arena *af_arena_new(void) { return af_calloc(1, sizeof(af_arena)); }

void af_arena_free(af_arena *a) {
    if (!a) return;
    for (block *b = a->head, *next; b; b = next) {
        next = b->next;
        free_block(b);
    }
    af_free(a);
}

void *af_arena_alloc(af_arena *a, size_t size) {
    size = size >= 1024 ? (size + 63) & ~(size_t)63 : (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    block *b = a->head;
    if (b && size >= 1024) b->used = (b->used + 63) & ~(size_t)63;
    if (!b || b->used > b->size || b->size - b->used < size) {
        size_t bsize = size > ARENA_BLOCK ? size : ARENA_BLOCK;
        if (bsize > SIZE_MAX - sizeof(block) - ((size_t)2 << 20)) return NULL;
        b = af_alloc_big(sizeof(block) + bsize);
        if (!b) return NULL;
        b->used = 0;
        b->size = bsize;
        b->data = false;
        /* A big one-off block goes behind the head so the head's free space stays usable. */
        if (a->head && bsize == size) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data_bytes + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

void *af_arena_alloc_data(af_arena *a, size_t size) {
    if (size < ARENA_BLOCK) return af_arena_alloc(a, size);
    size = (size + 63) & ~(size_t)63;
    if (size > SIZE_MAX - sizeof(block)) return NULL;
    block *b = af_alloc_pages(sizeof(block) + size); /* zeroed */
    if (!b) return NULL;
    b->used = b->size = size;
    b->data = true;
    /* behind the head, so that the head's free space stays usable */
    block **at = a->head ? &a->head->next : &a->head;
    b->next = *at;
    *at = b;
    return b->data_bytes;
}

static bool points_into(const block *b, const void *const *live, size_t n) {
    const unsigned char *lo = b->data_bytes, *hi = lo + b->size;
    for (size_t i = 0; i < n; i++)
        if ((const unsigned char *)live[i] >= lo && (const unsigned char *)live[i] < hi) return true;
    return false;
}

size_t af_arena_sweep_data(af_arena *a, const void *const *live, size_t n) {
    size_t freed = 0;
    for (block **p = a ? &a->head : NULL; p && *p;) {
        block *b = *p;
        if (b->data && !points_into(b, live, n)) {
            *p = b->next;
            freed += b->size;
            free_block(b);
        } else {
            p = &b->next;
        }
    }
    return freed;
}

void *af_arena_calloc(af_arena *a, size_t n, size_t size) {
    size_t total;
    if (!af_mul_size(n, size, &total) || total > SIZE_MAX - 16) return NULL;
    return af_arena_alloc(a, total);
}

char *af_arena_strndup(af_arena *a, const char *s, size_t len) {
    if (len == SIZE_MAX) return NULL;
    char *d = af_arena_alloc(a, len + 1);
    if (d && len) memcpy(d, s, len);
    return d;
}

char *af_arena_strdup(af_arena *a, const char *s) { return af_arena_strndup(a, s, strlen(s)); }

bool af_arena_grow(af_arena *a, void **arr, int *cap, int need, size_t size) {
    if (need <= *cap) return true;
    int ncap = *cap ? *cap : 4;
    while (ncap < need) {
        if (ncap > INT32_MAX / 2) return false;
        ncap *= 2;
    }
    void *n = af_arena_calloc(a, (size_t)ncap, size);
    if (!n) return false;
    if (*arr && *cap) memcpy(n, *arr, (size_t)*cap * size);
    *arr = n;
    *cap = ncap;
    return true;
}

float af_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t af_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    uint32_t man = x & 0x7fffff;
    if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) { /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into inf: correct */
    return (uint16_t)(sign | h);
}

float af_bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t af_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

int af_read_file(const char *path, unsigned char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 0, n = 0;
    unsigned char *buf = NULL;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            unsigned char *nb = af_realloc(buf, ncap);
            if (!nb) goto fail;
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) goto fail;
    fclose(f);
    *data = buf;
    *len = n;
    return 0;
fail:
    af_free(buf);
    fclose(f);
    return -1;
}

bool af_write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        b += k;
        n -= (size_t)k;
    }
    return true;
}

int af_write_atomic(const char *path, bool (*fill)(int fd, const void *ctx), const void *ctx,
                    bool *created) {
    size_t len = strlen(path);
    char *tmp = af_malloc(len + 8);
    *created = false;
    if (!tmp) return ENOMEM;
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".XXXXXX", 8); /* mkstemp's template */
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        af_free(tmp);
        return e;
    }
    *created = true;
    errno = 0;
    bool ok = fchmod(fd, 0644) == 0 && fill(fd, ctx) && fsync(fd) == 0;
    int saved = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        saved = errno;
    }
    if (!ok) unlink(tmp);
    af_free(tmp);
    return ok ? 0 : (saved ? saved : EIO);
}

/* The slow case copied backwards, 64 bytes at a time: each store then lands above the loads
 * still to come, so none of them seems to alias it (on Zen 3: REP MOVSB 4-6 GB/s, a forward
 * vector loop 33-55, this 44-76; BENCHMARKS.md). From 1 MiB on glibc leaves REP MOVSB (on AMD
 * above the L2 size) and memcpy is fast again. */
void af_copy(void *dst, const void *src, size_t n) {
    size_t ahead = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    if (n < 4096 || n >= ((size_t)1 << 20) || ahead == 0 || ahead >= 32) {
        memcpy(dst, src, n);
        return;
    }
    char *d = dst;
    const char *s = src;
    size_t tail = n % 64;
    for (size_t i = n - tail; i > 0; i -= 64) memcpy(d + i - 64, s + i - 64, 64);
    memcpy(d + n - tail, s + n - tail, tail);
}
