/* The JSON of pgrouter verify's topic side taken apart without Python objects, for
 * verify_fold.c (router._native.verify_fold; its twin router.verify.digests:fold_batch_py):
 * a record's envelope (envelope_scan) and a flat object, its ``after`` or its key
 * (flat_scan), checked as msgspec reads JSON; anything else is "not the plain case" (0),
 * which the caller leaves to msgspec and the Python fold.
 */
#include "verify.h"

#include <math.h>

/* ------------------------------------------------------------------------------------------
 * a flat JSON object (the record's ``after``, its key) taken apart without Python objects:
 * each member's name and its value's text as router.verify.digests renders it (str as it is,
 * int in decimal, bool true/false, a float as ``#`` and the hex of its big-endian float8, null
 * NULL; the member's kind tells a string's text from the others')
 */

static inline const char *
ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static int
hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p[i]);
        if (h < 0)
            return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

static void
put_cp(char *o, size_t *len, unsigned cp)
{
    if (cp < 0x80) {
        o[(*len)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*len)++] = (char)(0xC0 | (cp >> 6));
        o[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*len)++] = (char)(0xE0 | (cp >> 12));
        o[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*len)++] = (char)(0xF0 | (cp >> 18));
        o[(*len)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*len)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* 1 for the bytes a JSON string holds as they are: ASCII from 0x20, but '"' and '\\' */
static const unsigned char plain_ascii[256] = {
    [0x20] = 1, [0x21] = 1, [0x23 ... 0x5B] = 1, [0x5D ... 0x7F] = 1,
};

/* a JSON string at p (after its opening quote) unescaped into ``out`` (NULL: only read);
 * returns the end (after the closing quote), NULL when not the plain case (a lone surrogate,
 * a control character, bytes that are not UTF-8 as msgspec would refuse...), or
 * (const char *)1 on a Python error */
static const char *
string_text(Buf *out, const char *p, const char *e)
{
    if (out != NULL && buf_need(out, (size_t)(e - p)) < 0)
        return (const char *)1;
    char tmp[8], *o = out != NULL ? out->p : tmp; /* tmp: one character's room */
    size_t skipped = 0, *len = out != NULL ? &out->len : &skipped;
    while (p < e) {
        const char *q = p; /* a run of plain ASCII at once */
        while (q < e && plain_ascii[(unsigned char)*q])
            q++;
        if (out != NULL) {
            memcpy(o + *len, p, (size_t)(q - p));
            *len += (size_t)(q - p);
        }
        if ((p = q) >= e)
            break;
        unsigned char c = (unsigned char)*p;
        skipped = 0;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c >= 0x80) { /* UTF-8 as it is; only well-formed sequences */
            int n = utf8_sequence((const unsigned char *)p, e - p);
            if (!n)
                return NULL; /* overlong, surrogates, past U+10FFFF */
            memcpy(o + *len, p, (size_t)n);
            *len += (size_t)n;
            p += n;
            continue;
        }
        if (c != '\\') {
            o[(*len)++] = (char)c;
            p++;
            continue;
        }
        if (p + 1 >= e)
            return NULL;
        char x = p[1];
        p += 2;
        const char *plain = x ? strchr("\"\\/bfnrt", x) : NULL;
        if (plain != NULL) {
            o[(*len)++] = "\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
            continue;
        }
        unsigned cp, lo;
        if (x != 'u' || p + 4 > e || hex4(p, &cp) < 0)
            return NULL;
        p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return NULL;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (p + 6 > e || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) < 0 ||
                lo < 0xDC00 || lo > 0xDFFF)
                return NULL;
            p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        put_cp(o, len, cp);
    }
    return NULL;
}

/* the flat object in [p, e): 1 taken apart, 0 not the plain case, -1 error */
int
flat_scan(Flat *f, const char *p, const char *e)
{
    if (f->texts.p == NULL)
        buf_init(&f->texts, 0); /* a static Flat's first use */
    f->n = 0;
    f->texts.len = 0;
    p = ws(p, e);
    if (p >= e || *p++ != '{')
        return 0;
    p = ws(p, e);
    if (p < e && *p == '}')
        return ws(p + 1, e) == e;
    for (;;) {
        if (f->n >= FOLD_MAX_COLUMNS || p >= e || *p != '"')
            return 0;
        Member *m = &f->m[f->n];
        const char *q = ++p;
        while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) {
            int n = (unsigned char)*p < 0x80 ? 1 : utf8_sequence((const unsigned char *)p, e - p);
            if (!n)
                return 0; /* a name that is not UTF-8: msgspec refuses it (the slow way) */
            p += n;
        }
        if (p >= e || *p != '"')
            return 0; /* an escaped name: not the plain case */
        m->name = q;
        m->nlen = (size_t)(p - q);
        for (Py_ssize_t i = 0; i < f->n; i++)
            if (f->m[i].nlen == m->nlen && memcmp(f->m[i].name, q, m->nlen) == 0)
                return 0; /* a name twice */
        p = ws(p + 1, e);
        if (p >= e || *p++ != ':')
            return 0;
        p = ws(p, e);
        if (p >= e)
            return 0;
        m->start = f->texts.len;
        m->null = 0;
        char c = *p;
        if (c == '"') {
            m->kind = 's';
            const char *end = string_text(&f->texts, p + 1, e);
            if (end == (const char *)1)
                return -1;
            if (end == NULL)
                return 0;
            p = end;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            const char *q0 = p;
            int flt = 0;
            if (*p == '-')
                p++;
            if (p >= e || !(*p >= '0' && *p <= '9'))
                return 0;
            if (*p == '0' && p + 1 < e && p[1] >= '0' && p[1] <= '9')
                return 0;
            while (p < e && *p >= '0' && *p <= '9')
                p++;
            if (p < e && *p == '.') {
                flt = 1;
                p++;
                if (p >= e || !(*p >= '0' && *p <= '9'))
                    return 0;
                while (p < e && *p >= '0' && *p <= '9')
                    p++;
            }
            if (p < e && (*p == 'e' || *p == 'E')) {
                flt = 1;
                p++;
                if (p < e && (*p == '+' || *p == '-'))
                    p++;
                if (p >= e || !(*p >= '0' && *p <= '9'))
                    return 0;
                while (p < e && *p >= '0' && *p <= '9')
                    p++;
            }
            size_t n = (size_t)(p - q0);
            if (buf_need(&f->texts, 32) < 0)
                return -1;
            if (!flt) {
                /* an int: its decimal text as written, when canonical and of 18 digits
                 * at most ("-0" is 0; longer ones: Python's int, the slow way) */
                if (n > 18 + (*q0 == '-') || (n == 2 && q0[0] == '-' && q0[1] == '0'))
                    return 0;
                m->kind = 'i';
                memcpy(f->texts.p + f->texts.len, q0, n);
                f->texts.len += n;
            } else {
                char tmp[64];
                if (n >= sizeof(tmp))
                    return 0;
                memcpy(tmp, q0, n);
                tmp[n] = 0;
                char *endp;
                double d = PyOS_string_to_double(tmp, &endp, NULL);
                if (d == -1.0 && PyErr_Occurred())
                    return PyErr_Clear(), 0;
                if (endp != tmp + n || !isfinite(d))
                    return 0;
                float_text(f->texts.p + f->texts.len, d);
                f->texts.len += 17;
                m->kind = 'f';
            }
        } else if ((c == 't' && e - p >= 4 && memcmp(p, "true", 4) == 0) ||
                   (c == 'f' && e - p >= 5 && memcmp(p, "false", 5) == 0)) {
            size_t n = c == 't' ? 4 : 5; /* a bool: its text as it is */
            m->kind = 'b';
            if (buf_need(&f->texts, n) < 0)
                return -1;
            memcpy(f->texts.p + f->texts.len, p, n);
            f->texts.len += n;
            p += n;
        } else if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
            m->kind = 'n';
            m->null = 1;
            p += 4;
        } else {
            return 0; /* an array, an object: the slow way renders it */
        }
        m->len = f->texts.len - m->start;
        f->n++;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (p < e && *p == '}')
            return ws(p + 1, e) == e;
        return 0;
    }
}

/* ------------------------------------------------------------------------------------------
 * the envelope of a JSON-format record taken apart without msgspec: op, before, after, the
 * source's commit_lsn and seq, unchanged_toast; every other member skipped (its JSON checked)
 */
static const char *skip_value(const char *p, const char *e, int depth);

/* after a member's name: past its colon, at its value (NULL: not JSON, or nothing follows) */
static const char *
colon(const char *p, const char *e)
{
    p = ws(p, e);
    if (p >= e || *p++ != ':')
        return NULL;
    p = ws(p, e);
    return p < e ? p : NULL;
}

/* after a value in an object or an array closed by ``close``: 1 another follows (*pp past
 * the comma), 0 it closes (*pp past ``close``), -1 anything else */
static int
next_or_close(const char **pp, const char *e, char close)
{
    const char *p = ws(*pp, e);
    if (p < e && (*p == ',' || *p == close)) {
        *pp = p + 1;
        return *p == ',';
    }
    return -1;
}


/* a string's end (p after its opening quote), NULL when not valid or not the plain case
 * (string_text's rules: the record then goes to msgspec, which reads it or says why) */
static const char *
skip_string(const char *p, const char *e)
{
    const char *end = string_text(NULL, p, e);
    return end == (const char *)1 ? NULL : end;
}

static const char *
skip_number(const char *p, const char *e)
{
    if (p < e && *p == '-')
        p++;
    if (p >= e || !(*p >= '0' && *p <= '9'))
        return NULL;
    if (*p == '0' && p + 1 < e && p[1] >= '0' && p[1] <= '9')
        return NULL;
    while (p < e && *p >= '0' && *p <= '9')
        p++;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || !(*p >= '0' && *p <= '9'))
            return NULL;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-'))
            p++;
        if (p >= e || !(*p >= '0' && *p <= '9'))
            return NULL;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    return p;
}

/* any JSON value at p (whitespace skipped before): its end, NULL when not valid or deeper
 * than 64 */
static const char *
skip_value(const char *p, const char *e, int depth)
{
    p = ws(p, e);
    if (p >= e || depth > 64)
        return NULL;
    char c = *p;
    if (c == '"')
        return skip_string(p + 1, e);
    if (c == '-' || (c >= '0' && c <= '9'))
        return skip_number(p, e);
    if (e - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0))
        return p + 4;
    if (e - p >= 5 && memcmp(p, "false", 5) == 0)
        return p + 5;
    if (c == '[' || c == '{') {
        char close = c == '[' ? ']' : '}';
        p = ws(p + 1, e);
        if (p < e && *p == close)
            return p + 1;
        for (;;) {
            if (c == '{') {
                p = ws(p, e);
                if (p >= e || *p != '"' || (p = skip_string(p + 1, e)) == NULL ||
                    (p = colon(p, e)) == NULL)
                    return NULL;
            }
            if ((p = skip_value(p, e, depth + 1)) == NULL)
                return NULL;
            int more = next_or_close(&p, e, close);
            if (more < 0)
                return NULL;
            if (!more)
                return p;
        }
    }
    return NULL;
}

/* a member's name at p (at its opening quote), no escapes, UTF-8: its end after the closing
 * quote (a name that is not UTF-8, in a member the fold skips, is what msgspec's typed decoder
 * skips unread; a consumer's JSON parser refuses the record: the feeder names it) */
static const char *
plain_name(const char *p, const char *e, const char **name, size_t *len)
{
    if (p >= e || *p != '"')
        return NULL;
    const char *q = ++p;
    while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) {
        int n = (unsigned char)*p < 0x80 ? 1 : utf8_sequence((const unsigned char *)p, e - p);
        if (!n)
            return NULL;
        p += n;
    }
    if (p >= e || *p != '"')
        return NULL;
    *name = q;
    *len = (size_t)(p - q);
    return p + 1;
}

static int
is_name(const char *name, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(name, lit, len) == 0;
}

/* a non-negative int of 64 bits or null at p: its end; NULL otherwise */
static const char *
u64_value(const char *p, const char *e, unsigned long long *out)
{
    if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
        *out = 0;
        return p + 4;
    }
    const char *q = skip_number(p, e);
    if (q == NULL || *p == '-' || q - p > 19)
        return NULL;
    unsigned long long v = 0;
    for (const char *d = p; d < q; d++) {
        if (*d < '0' || *d > '9')
            return NULL; /* a fraction or an exponent: not an int */
        v = v * 10 + (unsigned long long)(*d - '0');
    }
    *out = v;
    return q;
}


/* the record's envelope: 1 the plain case (c/r/u, before null, after an object, a source,
 * no unchanged TOAST), 0 anything else */
int
envelope_scan(const char *p, const char *e, Envelope *env)
{
    int seen = 0; /* op 1, before 2, after 4, source 8, unchanged_toast 16 */
    env->op = 0;
    env->after = NULL;
    env->lsn = env->seq = 0;
    env->has_source = 0;
    p = ws(p, e);
    if (p >= e || *p++ != '{')
        return 0;
    p = ws(p, e);
    if (p < e && *p == '}')
        return 0;
    for (;;) {
        const char *name;
        size_t len;
        int bit = 0;
        p = ws(p, e);
        if ((p = plain_name(p, e, &name, &len)) == NULL || (p = colon(p, e)) == NULL)
            return 0;
        if (is_name(name, len, "op")) {
            bit = 1;
            if (e - p < 3 || p[0] != '"' || p[2] != '"')
                return 0;
            env->op = p[1];
            p += 3;
        } else if (is_name(name, len, "before")) {
            bit = 2;
            if (e - p < 4 || memcmp(p, "null", 4) != 0)
                return 0;
            p += 4;
        } else if (is_name(name, len, "after")) {
            bit = 4;
            if (*p != '{')
                return 0;
            env->after = p;
            if ((p = skip_value(p, e, 0)) == NULL)
                return 0;
            env->after_end = p;
        } else if (is_name(name, len, "source")) {
            bit = 8;
            if (*p != '{')
                return 0;
            env->has_source = 1;
            int got = 0; /* commit_lsn 1, seq 2 */
            p = ws(p + 1, e);
            if (p < e && *p == '}') {
                p++;
            } else {
                for (;;) {
                    const char *sn;
                    size_t sl;
                    p = ws(p, e);
                    if ((p = plain_name(p, e, &sn, &sl)) == NULL || (p = colon(p, e)) == NULL)
                        return 0;
                    int sb = is_name(sn, sl, "commit_lsn") ? 1 : is_name(sn, sl, "seq") ? 2 : 0;
                    if (sb) {
                        if (got & sb)
                            return 0;
                        got |= sb;
                        p = u64_value(p, e, sb == 1 ? &env->lsn : &env->seq);
                    } else {
                        p = skip_value(p, e, 1);
                    }
                    int more = p == NULL ? -1 : next_or_close(&p, e, '}');
                    if (more < 0)
                        return 0;
                    if (!more)
                        break;
                }
            }
        } else if (is_name(name, len, "unchanged_toast")) {
            bit = 16;
            if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
                p += 4;
            } else if (*p == '[') {
                p = ws(p + 1, e);
                if (p >= e || *p++ != ']')
                    return 0;
            } else {
                return 0;
            }
        } else if ((p = skip_value(p, e, 0)) == NULL) {
            return 0;
        }
        if (seen & bit)
            return 0;
        seen |= bit;
        int more = next_or_close(&p, e, '}');
        if (more < 0)
            return 0;
        if (!more)
            break;
    }
    if (ws(p, e) != e)
        return 0;
    return (env->op == 'c' || env->op == 'r' || env->op == 'u') && env->after != NULL &&
           env->has_source;
}

static int
member_cmp(const void *a, const void *b)
{
    const Member *x = *(const Member *const *)a, *y = *(const Member *const *)b;
    size_t n = x->nlen < y->nlen ? x->nlen : y->nlen;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->nlen > y->nlen) - (x->nlen < y->nlen);
}

/* the members sorted by name (UTF-8 bytes order: Python's order of the names) */
void
flat_sorted(Flat *f, Member **out)
{
    for (Py_ssize_t i = 0; i < f->n; i++)
        out[i] = &f->m[i];
    if (f->n > 32) {
        qsort(out, (size_t)f->n, sizeof(Member *), member_cmp);
        return;
    }
    /* a few members (a row's, a key's): insertion sort, without glibc qsort's allocation,
     * and none at all when they come sorted (a key of one column, msgspec's sorted keys) */
    for (Py_ssize_t i = 1; i < f->n; i++) {
        Member *m = out[i];
        Py_ssize_t j = i;
        for (; j > 0 && member_cmp(&out[j - 1], &m) > 0; j--)
            out[j] = out[j - 1];
        out[j] = m;
    }
}

