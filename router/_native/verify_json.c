/* The JSON of pgrouter verify's topic side taken apart without Python objects, for
 * verify_fold.c (router._native.verify_fold; its twin router.verify_digest:fold_batch_py):
 * a record's envelope (envelope_scan) and a flat object, its ``after`` or its key
 * (flat_scan), checked as msgspec reads JSON; anything else is "not the plain case" (0),
 * which the caller leaves to msgspec and the Python fold.
 */
#include "native.h"

#include <math.h>

/* ------------------------------------------------------------------------------------------
 * a flat JSON object (the record's ``after``, its key) taken apart without Python objects:
 * each member's name and its value's text as router.verify_digest renders it (str as it is,
 * int in decimal, bool true/false, a float as ``#`` and the hex of its big-endian float8, null
 * NULL; the member's kind tells a string's text from the others')
 */

static int
flat_need(Flat *f, size_t more)
{
    if (f->tlen + more <= f->tcap)
        return 0;
    size_t cap = f->tcap ? f->tcap * 2 : 1024;
    while (cap < f->tlen + more)
        cap *= 2;
    char *p = PyMem_Realloc(f->texts, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    f->texts = p;
    f->tcap = cap;
    return 0;
}

const char *
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
        int h = p[i] >= '0' && p[i] <= '9'   ? p[i] - '0'
                : p[i] >= 'a' && p[i] <= 'f' ? p[i] - 'a' + 10
                : p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 10
                                             : -1;
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

/* a JSON string at p (after its opening quote) unescaped into f->texts; returns the end
 * (after the closing quote), NULL when not the plain case (a lone surrogate, a control
 * character, bytes that are not UTF-8 as msgspec would refuse...), or (const char *)1 on a
 * Python error */
static const char *
string_text(Flat *f, const char *p, const char *e)
{
    if (flat_need(f, (size_t)(e - p)) < 0)
        return (const char *)1;
    char *o = f->texts;
    while (p < e) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c >= 0x80) { /* UTF-8 as it is; only well-formed sequences */
            int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
            if (!n || c > 0xF4 || p + n > e)
                return NULL;
            for (int i = 1; i < n; i++)
                if (((unsigned char)p[i] & 0xC0) != 0x80)
                    return NULL;
            unsigned char c1 = (unsigned char)p[1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) ||
                (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90))
                return NULL; /* overlong, surrogates, past U+10FFFF */
            memcpy(o + f->tlen, p, (size_t)n);
            f->tlen += (size_t)n;
            p += n;
            continue;
        }
        if (c != '\\') {
            o[f->tlen++] = (char)c;
            p++;
            continue;
        }
        if (p + 1 >= e)
            return NULL;
        char x = p[1];
        p += 2;
        switch (x) {
        case '"': o[f->tlen++] = '"'; break;
        case '\\': o[f->tlen++] = '\\'; break;
        case '/': o[f->tlen++] = '/'; break;
        case 'b': o[f->tlen++] = '\b'; break;
        case 'f': o[f->tlen++] = '\f'; break;
        case 'n': o[f->tlen++] = '\n'; break;
        case 'r': o[f->tlen++] = '\r'; break;
        case 't': o[f->tlen++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (p + 4 > e || hex4(p, &cp) < 0)
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
            put_cp(o, &f->tlen, cp);
            break;
        }
        default:
            return NULL;
        }
    }
    return NULL;
}

/* the flat object in [p, e): 1 taken apart, 0 not the plain case, -1 error */
int
flat_scan(Flat *f, const char *p, const char *e)
{
    f->n = 0;
    f->tlen = 0;
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
        while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
            p++;
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
        m->start = f->tlen;
        m->null = 0;
        char c = *p;
        if (c == '"') {
            m->kind = 's';
            const char *end = string_text(f, p + 1, e);
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
            if (flat_need(f, 32) < 0)
                return -1;
            if (!flt) {
                /* an int: its decimal text as written, when canonical and of 18 digits
                 * at most ("-0" is 0; longer ones: Python's int, the slow way) */
                if (n > 18 + (*q0 == '-') || (n == 2 && q0[0] == '-' && q0[1] == '0'))
                    return 0;
                m->kind = 'i';
                memcpy(f->texts + f->tlen, q0, n);
                f->tlen += n;
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
                static const char hex[] = "0123456789abcdef";
                unsigned char raw[8];
                memcpy(raw, &d, 8);
                f->texts[f->tlen++] = '#'; /* never an int's text */
                for (int j = 0; j < 8; j++) {
                    unsigned char b = raw[PY_LITTLE_ENDIAN ? 7 - j : j];
                    f->texts[f->tlen++] = hex[b >> 4];
                    f->texts[f->tlen++] = hex[b & 15];
                }
                m->kind = 'f';
            }
        } else if (e - p >= 4 && memcmp(p, "true", 4) == 0) {
            m->kind = 'b';
            if (flat_need(f, 4) < 0)
                return -1;
            memcpy(f->texts + f->tlen, "true", 4);
            f->tlen += 4;
            p += 4;
        } else if (e - p >= 5 && memcmp(p, "false", 5) == 0) {
            m->kind = 'b';
            if (flat_need(f, 5) < 0)
                return -1;
            memcpy(f->texts + f->tlen, "false", 5);
            f->tlen += 5;
            p += 5;
        } else if (e - p >= 4 && memcmp(p, "null", 4) == 0) {
            m->kind = 'n';
            m->null = 1;
            p += 4;
        } else {
            return 0; /* an array, an object: the slow way renders it */
        }
        m->len = f->tlen - m->start;
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

/* a string's end (p after its opening quote), NULL when not valid (as msgspec reads it) */
static const char *
skip_string(const char *p, const char *e)
{
    while (p < e) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c == '\\') {
            if (p + 1 >= e)
                return NULL;
            char x = p[1];
            if (x == 'u') {
                unsigned cp;
                if (p + 6 > e || hex4(p + 2, &cp) < 0)
                    return NULL;
                p += 6;
            } else if (strchr("\"\\/bfnrt", x) && x) {
                p += 2;
            } else {
                return NULL;
            }
            continue;
        }
        if (c >= 0x80) {
            int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
            if (!n || c > 0xF4 || p + n > e)
                return NULL;
            for (int i = 1; i < n; i++)
                if (((unsigned char)p[i] & 0xC0) != 0x80)
                    return NULL;
            unsigned char c1 = (unsigned char)p[1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) ||
                (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90))
                return NULL;
            p += n;
            continue;
        }
        p++;
    }
    return NULL;
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
                if (p >= e || *p != '"' || (p = skip_string(p + 1, e)) == NULL)
                    return NULL;
                p = ws(p, e);
                if (p >= e || *p++ != ':')
                    return NULL;
            }
            if ((p = skip_value(p, e, depth + 1)) == NULL)
                return NULL;
            p = ws(p, e);
            if (p < e && *p == ',') {
                p++;
                continue;
            }
            if (p < e && *p == close)
                return p + 1;
            return NULL;
        }
    }
    return NULL;
}

/* a member's name at p (at its opening quote), no escapes: its end after the closing quote */
static const char *
plain_name(const char *p, const char *e, const char **name, size_t *len)
{
    if (p >= e || *p != '"')
        return NULL;
    const char *q = ++p;
    while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
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
        if ((p = plain_name(p, e, &name, &len)) == NULL)
            return 0;
        p = ws(p, e);
        if (p >= e || *p++ != ':')
            return 0;
        p = ws(p, e);
        if (p >= e)
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
                    if ((p = plain_name(p, e, &sn, &sl)) == NULL)
                        return 0;
                    p = ws(p, e);
                    if (p >= e || *p++ != ':')
                        return 0;
                    p = ws(p, e);
                    int sb = is_name(sn, sl, "commit_lsn") ? 1 : is_name(sn, sl, "seq") ? 2 : 0;
                    if (sb) {
                        if (got & sb)
                            return 0;
                        got |= sb;
                        p = u64_value(p, e, sb == 1 ? &env->lsn : &env->seq);
                    } else {
                        p = skip_value(p, e, 1);
                    }
                    if (p == NULL)
                        return 0;
                    p = ws(p, e);
                    if (p < e && *p == ',') {
                        p++;
                        continue;
                    }
                    if (p < e && *p == '}') {
                        p++;
                        break;
                    }
                    return 0;
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
        p = ws(p, e);
        if (p < e && *p == ',') {
            p++;
            continue;
        }
        if (p < e && *p == '}')
            break;
        return 0;
    }
    if (ws(p + 1, e) != e)
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
    qsort(out, (size_t)f->n, sizeof(Member *), member_cmp);
}

