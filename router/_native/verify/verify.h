/* pgrouter verify's C (router.verify.digests's rules; its Python twins there): what the
 * verify files share. The calls go one way, down to verify_digest.c:
 *
 *   verify.c        verify_row (the digests of a decoded row)           -> verify_digest.c
 *                   verify_sums (a fold's rows summed by bucket)
 *   verify_fold.c   verify_fold (a batch of a topic's messages folded)  -> verify_json.c,
 *                                                                          verify_digest.c
 *   verify_copy.c   verify_copy (COPY text rows' digests by bucket)     -> verify_digest.c
 *   verify_json.c   a record's envelope and a flat object taken apart
 *   verify_digest.c MD5, the growing buffer, a row's key text, JSON array and digests
 *
 * The four functions are in module.c's table (native.h declares them).
 */
#ifndef PGROUTER_NATIVE_VERIFY_H
#define PGROUTER_NATIVE_VERIFY_H

#include "../native.h"

/* the digest of a column whose value is not a string (an int, a bool, a float) is the hash of
 * its text XOR this: "24" and 24 differ (router.verify.digests.RAW_SALT) */
#define VERIFY_RAW_SALT 0x2545F4914F6CDD1DLL
#define FOLD_MAX_COLUMNS 1664

/* ------------------------------------------------------------------------------------------
 * verify_digest.c
 */

/* MD5 (RFC 1321); md5_head64: the digest's first 8 bytes, big-endian */
typedef struct {
    uint32_t h[4];
    uint64_t len;
    unsigned char buf[64];
    size_t n;
} Md5;
void md5_init(Md5 *m);
void md5_update(Md5 *m, const void *data, size_t n);
uint64_t md5_head64(Md5 *m);

/* A growing buffer, its first 2 KB in the struct (buf_init). ``quiet``: a failed allocation
 * sets no Python error (used without the GIL); the memory is PyMem_Raw's either way. */
typedef struct {
    char *p;
    size_t len, cap;
    int quiet;
    char stack[2048];
} Buf;
void buf_init(Buf *b, int quiet);
void buf_free(Buf *b);
int buf_need(Buf *b, size_t more);

/* A row's texts as the digests take them (router.verify.digests's rules), one value at a time:
 * key_part adds ``length:text`` (``str``), ``length=text`` (the others) or ``!`` (``null``) to
 * the key's text; row_part adds the value to the row's JSON array (opened by its first value,
 * closed by row_close): a string quoted as msgspec writes it, ``null``, the others' texts
 * bare. 0, or -1 out of memory. */
int key_part(Buf *k, int first, const char *t, size_t n, int null, int str);
int json_value(Buf *b, const char *t, size_t n, int null, int str); /* one value alone */
int row_part(Buf *b, int first, const char *t, size_t n, int null, int str);
int row_close(Buf *b, int empty);

/* The key's bucket (the md5 of its text, its first 28 bits, modulo buckets) and the row's
 * digest (the md5 of the key's text, head and the row's JSON array, its first 60 bits). */
void digest_tail(const Buf *key, const char *head, size_t headlen, const Buf *row,
                 uint64_t buckets, int64_t *bucket, int64_t *digest);

/* A row's digests being made (verify_row's layout: a hash per column, the key's bucket, the
 * row's digest, native int64 each): digests_start allocates them (``digests[i]`` to fill)
 * and readies the key's text and the row's array (key_part, row_part); digests_finish
 * closes the array, computes the tail (digest_tail) and returns the bytes when ``res`` is 0,
 * Py_None (a new reference) when it is 1 (declined), NULL when -1 (an error set). */
typedef struct {
    PyObject *out;
    int64_t *digests;
    Py_ssize_t n;
    Buf key, row;
} Digests;
int digests_start(Digests *d, Py_ssize_t n);
PyObject *digests_finish(Digests *d, int res, const char *head, size_t headlen,
                         uint64_t buckets);

/* a finite float's text: ``#`` and the hex of its big-endian float8 (17 bytes, no NUL) */
void float_text(char out[17], double d);

/* ------------------------------------------------------------------------------------------
 * verify_json.c: a record's envelope and a flat object taken apart (for verify_fold.c)
 */
typedef struct {
    const char *name;
    size_t nlen;
    size_t start, len; /* the text in Flat.texts */
    int null;
    char kind; /* 's' string, 'i' int, 'f' float, 'b' bool, 'n' null */
} Member;

typedef struct {
    Member m[FOLD_MAX_COLUMNS];
    Py_ssize_t n;
    Buf texts;
} Flat;

typedef struct {
    char op;
    const char *after, *after_end;
    unsigned long long lsn, seq;
    int has_source;
} Envelope;
int flat_scan(Flat *f, const char *p, const char *e);
int envelope_scan(const char *p, const char *e, Envelope *env);
void flat_sorted(Flat *f, Member **out); /* by name, as Python orders the names */

#endif
