/* The digests' base, shared by verify.c, verify_fold.c and verify_copy.c (verify.h): MD5,
 * the growing buffer, a row's key text and JSON array built a value at a time, and the tail
 * every digest ends with (the key's bucket, the row's digest): router.verify.digests's rules,
 * written once.
 */
#include "verify.h"

/* ------------------------------------------------------------------------------------------
 * MD5 (RFC 1321)
 */

static const uint32_t md5_k[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
    0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
    0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
    0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
    0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
    0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
    0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
    0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
    0xeb86d391};

static const unsigned char md5_s[64] = {
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
    5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
    6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

void
md5_init(Md5 *m)
{
    m->h[0] = 0x67452301;
    m->h[1] = 0xefcdab89;
    m->h[2] = 0x98badcfe;
    m->h[3] = 0x10325476;
    m->len = 0;
    m->n = 0;
}

static void
md5_block(Md5 *m, const unsigned char *p)
{
    uint32_t w[16], a = m->h[0], b = m->h[1], c = m->h[2], d = m->h[3];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8) |
               ((uint32_t)p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
    /* the 64 steps unrolled: step i takes word g(i), constant md5_k[i], shift md5_s[i] */
#define MD5_F(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define MD5_G(x, y, z) ((y) ^ ((z) & ((x) ^ (y))))
#define MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))
#define MD5_STEP(f, a, b, c, d, x, k, s)                                                    \
    (a) += f((b), (c), (d)) + (x) + (k);                                                    \
    (a) = ((a) << (s)) | ((a) >> (32 - (s)));                                               \
    (a) += (b);
#define MD5_ROUND(f, i, g0, g1, g2, g3)                                                     \
    MD5_STEP(f, a, b, c, d, w[g0], md5_k[i], md5_s[i])                                      \
    MD5_STEP(f, d, a, b, c, w[g1], md5_k[i + 1], md5_s[i + 1])                              \
    MD5_STEP(f, c, d, a, b, w[g2], md5_k[i + 2], md5_s[i + 2])                              \
    MD5_STEP(f, b, c, d, a, w[g3], md5_k[i + 3], md5_s[i + 3])
    MD5_ROUND(MD5_F, 0, 0, 1, 2, 3)
    MD5_ROUND(MD5_F, 4, 4, 5, 6, 7)
    MD5_ROUND(MD5_F, 8, 8, 9, 10, 11)
    MD5_ROUND(MD5_F, 12, 12, 13, 14, 15)
    MD5_ROUND(MD5_G, 16, 1, 6, 11, 0)
    MD5_ROUND(MD5_G, 20, 5, 10, 15, 4)
    MD5_ROUND(MD5_G, 24, 9, 14, 3, 8)
    MD5_ROUND(MD5_G, 28, 13, 2, 7, 12)
    MD5_ROUND(MD5_H, 32, 5, 8, 11, 14)
    MD5_ROUND(MD5_H, 36, 1, 4, 7, 10)
    MD5_ROUND(MD5_H, 40, 13, 0, 3, 6)
    MD5_ROUND(MD5_H, 44, 9, 12, 15, 2)
    MD5_ROUND(MD5_I, 48, 0, 7, 14, 5)
    MD5_ROUND(MD5_I, 52, 12, 3, 10, 1)
    MD5_ROUND(MD5_I, 56, 8, 15, 6, 13)
    MD5_ROUND(MD5_I, 60, 4, 11, 2, 9)
#undef MD5_ROUND
#undef MD5_STEP
#undef MD5_F
#undef MD5_G
#undef MD5_H
#undef MD5_I
    m->h[0] += a;
    m->h[1] += b;
    m->h[2] += c;
    m->h[3] += d;
}

void
md5_update(Md5 *m, const void *data, size_t n)
{
    const unsigned char *p = data;
    m->len += n;
    if (m->n) {
        size_t take = 64 - m->n < n ? 64 - m->n : n;
        memcpy(m->buf + m->n, p, take);
        m->n += take;
        p += take;
        n -= take;
        if (m->n < 64)
            return;
        md5_block(m, m->buf);
        m->n = 0;
    }
    for (; n >= 64; p += 64, n -= 64)
        md5_block(m, p);
    memcpy(m->buf, p, n);
    m->n = n;
}

/* the first 8 bytes of the digest, big-endian (md5's words are little-endian) */
uint64_t
md5_head64(Md5 *m)
{
    uint64_t bits = m->len * 8;
    unsigned char pad[72] = {0x80};
    size_t padn = (m->n < 56 ? 56 - m->n : 120 - m->n);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (8 * i));
    md5_update(m, pad, padn);
    md5_update(m, len, 8);
    uint64_t out = 0;
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 4; i++)
            out = (out << 8) | ((m->h[w] >> (8 * i)) & 0xff);
    return out;
}

/* ------------------------------------------------------------------------------------------
 * the growing buffer
 */

void
buf_init(Buf *b, int quiet)
{
    b->p = b->stack;
    b->len = 0;
    b->cap = sizeof(b->stack);
    b->quiet = quiet;
}

void
buf_free(Buf *b)
{
    if (b->p != b->stack)
        PyMem_RawFree(b->p);
    b->p = b->stack;
    b->len = 0;
    b->cap = sizeof(b->stack);
}

int
buf_need(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    char *p = b->p == b->stack ? PyMem_RawMalloc(cap) : PyMem_RawRealloc(b->p, cap);
    if (p == NULL) {
        if (!b->quiet)
            PyErr_NoMemory();
        return -1;
    }
    if (b->p == b->stack)
        memcpy(p, b->stack, b->len);
    b->p = p;
    b->cap = cap;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * a row's key text and JSON array
 */

static size_t
utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static char *
decimal(char *o, size_t v)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *o++ = digits[--n];
    return o;
}

int
key_part(Buf *k, int first, const char *t, size_t n, int null, int str)
{
    if (buf_need(k, n + 24) < 0)
        return -1;
    char *o = k->p + k->len;
    if (!first)
        *o++ = ',';
    if (null) {
        *o++ = '!';
    } else {
        o = decimal(o, utf8_chars(t, n));
        *o++ = str ? ':' : '=';
        memcpy(o, t, n);
        o += n;
    }
    k->len = (size_t)(o - k->p);
    return 0;
}

int
json_value(Buf *b, const char *t, size_t n, int null, int str)
{
    if (buf_need(b, (str ? n * 6 + 2 : n) + 4) < 0)
        return -1;
    char *o = b->p + b->len;
    if (null) {
        memcpy(o, "null", 4);
        o += 4;
    } else if (str) {
        o = json_quote(o, t, n);
    } else { /* an int, a bool, a float: its text bare, as JSON has it */
        memcpy(o, t, n);
        o += n;
    }
    b->len = (size_t)(o - b->p);
    return 0;
}

int
row_part(Buf *b, int first, const char *t, size_t n, int null, int str)
{
    if (buf_need(b, 1) < 0)
        return -1;
    b->p[b->len++] = first ? '[' : ',';
    return json_value(b, t, n, null, str);
}

int
row_close(Buf *b, int empty)
{
    if (buf_need(b, 2) < 0)
        return -1;
    if (empty)
        b->p[b->len++] = '[';
    b->p[b->len++] = ']';
    return 0;
}

void
digest_tail(const Buf *key, const char *head, size_t headlen, const Buf *row,
            uint64_t buckets, int64_t *bucket, int64_t *digest)
{
    Md5 k, r;
    md5_init(&k);
    md5_update(&k, key->p, key->len);
    r = k;
    *bucket = (int64_t)(((md5_head64(&k) >> 32) >> 4) % buckets);
    md5_update(&r, head, headlen);
    md5_update(&r, row->p, row->len);
    *digest = (int64_t)(md5_head64(&r) >> 4);
}

int
digests_start(Digests *d, Py_ssize_t n)
{
    d->n = n;
    d->out = PyBytes_FromStringAndSize(NULL, (n + 2) * 8);
    if (d->out == NULL)
        return -1;
    d->digests = (int64_t *)PyBytes_AS_STRING(d->out);
    buf_init(&d->key, 0);
    buf_init(&d->row, 0);
    return 0;
}

PyObject *
digests_finish(Digests *d, int res, const char *head, size_t headlen, uint64_t buckets)
{
    if (!res)
        res = row_close(&d->row, d->n == 0);
    if (!res)
        digest_tail(&d->key, head, headlen, &d->row, buckets, &d->digests[d->n],
                    &d->digests[d->n + 1]);
    buf_free(&d->key);
    buf_free(&d->row);
    if (!res)
        return d->out;
    Py_CLEAR(d->out);
    return res < 0 ? NULL : Py_NewRef(Py_None);
}

void
float_text(char out[17], double d)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[8];
    memcpy(raw, &d, 8);
    out[0] = '#'; /* never an int's text */
    for (int j = 0; j < 8; j++) { /* big-endian: struct.pack(">d") */
        unsigned char c = raw[PY_LITTLE_ENDIAN ? 7 - j : j];
        out[1 + 2 * j] = hex[c >> 4];
        out[2 + 2 * j] = hex[c & 15];
    }
}
