/* verify_fold: a batch of a JSON-format topic's messages folded by ``pgrouter verify`` with
 * bucket digests (its Python twin: router.verify_digest:fold_batch_py, whose docstring holds
 * the rules).
 *
 * verify_fold(msgs, ends, rows, cut, buckets, tools) -> (read, after_cut, folded)
 *
 *   msgs     confluent-kafka Messages (error(), partition(), offset(), key(), value())
 *   ends     partition -> end offset: messages at or past it are not read
 *   rows     the fold's dict: key bytes -> (position, (names, digests))
 *   tools    (decode_change, decode_key, encode_key, layout_of, slow, row_py)
 *
 * A message is folded here only in the plain case: a change record ``c``/``r``/``u`` with a
 * key, a source, ``after``, no ``before`` and no ``unchanged_toast``, a key that decodes to
 * a dict. Anything else (and any error decoding it) goes to ``slow(key, value)``, the Python
 * feeder, which folds it or raises the precise error; values that are not JSON scalars get
 * their digests from ``row_py`` (router.verify_digest.row_digests_py).
 */
#include "native.h"

#include <math.h>

static PyObject *s_error, *s_partition, *s_offset, *s_key, *s_value, *sixty_four;

#define FOLD_MAX_COLUMNS 1664

int
fold_setup(void)
{
    struct {
        PyObject **at;
        const char *name;
    } names[] = {{&s_error, "error"}, {&s_partition, "partition"}, {&s_offset, "offset"},
                 {&s_key, "key"},     {&s_value, "value"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    sixty_four = PyLong_FromLong(64);
    return sixty_four == NULL ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------
 * a flat JSON object (the record's ``after``, its key) taken apart without Python objects:
 * each member's name and its value's text as router.verify_digest renders it (str as it is,
 * int in decimal, bool true/false, a float as the hex of its big-endian float8, null NULL)
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
    char *texts;
    size_t tlen, tcap;
} Flat;

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

static const char *
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
static int
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

typedef struct {
    char op;
    const char *after, *after_end;
    unsigned long long lsn, seq;
    int has_source;
} Envelope;

/* the record's envelope: 1 the plain case (c/r/u, before null, after an object, a source,
 * no unchanged TOAST), 0 anything else */
static int
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
static void
flat_sorted(Flat *f, Member **out)
{
    for (Py_ssize_t i = 0; i < f->n; i++)
        out[i] = &f->m[i];
    qsort(out, (size_t)f->n, sizeof(Member *), member_cmp);
}

/* the layout of the last row: its names sorted, as a tuple and as JSON (head) */
typedef struct {
    PyObject *names, *head;
    char *joined; /* the sorted names, each followed by a NUL */
    size_t jlen;
} Layout;

static void
layout_clear(Layout *l)
{
    Py_CLEAR(l->names);
    Py_CLEAR(l->head);
    PyMem_Free(l->joined);
    l->joined = NULL;
    l->jlen = 0;
}

/* the layout of the sorted members (the cached one when their names are the same) */
static int
layout_for(Layout *l, Member **s, Py_ssize_t n)
{
    size_t jlen = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        jlen += s[i]->nlen + 1;
    if (l->names != NULL && jlen == l->jlen && PyTuple_GET_SIZE(l->names) == n) {
        size_t at = 0;
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            if (memcmp(l->joined + at, s[i]->name, s[i]->nlen) || l->joined[at + s[i]->nlen])
                break;
            at += s[i]->nlen + 1;
        }
        if (i == n)
            return 0;
    }
    layout_clear(l);
    l->joined = PyMem_Malloc(jlen + 1);
    PyObject *names = PyTuple_New(n), *head = NULL;
    char *h = PyMem_Malloc(jlen * 1 + 3 * (size_t)n + 3);
    if (l->joined == NULL || names == NULL || h == NULL)
        goto fail;
    size_t at = 0, hl = 0;
    h[hl++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyUnicode_DecodeUTF8(s[i]->name, (Py_ssize_t)s[i]->nlen, NULL);
        if (name == NULL)
            goto fail;
        PyTuple_SET_ITEM(names, i, name);
        memcpy(l->joined + at, s[i]->name, s[i]->nlen);
        at += s[i]->nlen;
        l->joined[at++] = 0;
        if (i)
            h[hl++] = ',';
        h[hl++] = '"';
        memcpy(h + hl, s[i]->name, s[i]->nlen);
        hl += s[i]->nlen;
        h[hl++] = '"';
    }
    h[hl++] = ']';
    head = PyBytes_FromStringAndSize(h, (Py_ssize_t)hl);
    PyMem_Free(h);
    h = NULL;
    if (head == NULL)
        goto fail;
    l->names = names;
    l->head = head;
    l->jlen = jlen;
    return 0;
fail:
    PyMem_Free(h);
    Py_XDECREF(names);
    PyMem_Free(l->joined);
    l->joined = NULL;
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    return -1;
}

typedef struct {
    PyObject *rows;
    unsigned long long cut;
    long long buckets;
    Layout row;
    Flat after, key;
    Member *sorted[FOLD_MAX_COLUMNS], *ksorted[FOLD_MAX_COLUMNS];
} Fold;

/* msgspec's JSON of the key (router.verify.key_of: names sorted) as new bytes; None (a new
 * reference) when not the plain case (a float in the key) */
static PyObject *
key_bytes(Fold *f, Py_ssize_t n)
{
    Flat *k = &f->key;
    Buf b = {.len = 0, .cap = sizeof(b.stack)};
    b.p = b.stack;
    PyObject *out = NULL;
    if (buf_need(&b, 1) < 0)
        goto done;
    b.p[b.len++] = '{';
    for (Py_ssize_t i = 0; i < n; i++) {
        Member *m = f->ksorted[i];
        if (m->kind == 'f') {
            out = Py_NewRef(Py_None);
            goto done;
        }
        if (buf_need(&b, m->nlen + 8) < 0)
            goto done;
        if (i)
            b.p[b.len++] = ',';
        b.p[b.len++] = '"';
        memcpy(b.p + b.len, m->name, m->nlen);
        b.len += m->nlen;
        b.p[b.len++] = '"';
        b.p[b.len++] = ':';
        if (m->null) {
            memcpy(b.p + b.len, "null", 4);
            b.len += 4;
        } else if (m->kind == 's') {
            if (buf_string(&b, k->texts + m->start, (Py_ssize_t)m->len) < 0)
                goto done;
        } else {
            if (buf_need(&b, m->len) < 0)
                goto done;
            memcpy(b.p + b.len, k->texts + m->start, m->len);
            b.len += m->len;
        }
    }
    if (buf_need(&b, 1) < 0)
        goto done;
    b.p[b.len++] = '}';
    out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
done:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    return out;
}

static int
ascii(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80)
            return 0;
    return 1;
}

/* Python's hash of a text (router.verify_digest.row_digests_py hashes the str) */
static Py_hash_t
text_hash(const char *p, size_t n)
{
    if (ascii(p, n))
        return _Py_HashBytes(p, (Py_ssize_t)n); /* a compact ASCII str hashes its bytes */
    PyObject *s = PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, NULL);
    if (s == NULL)
        return -1;
    Py_hash_t h = PyObject_Hash(s);
    Py_DECREF(s);
    return h;
}

static size_t
utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* the digests of the scanned row (row_digests' layout: a hash per column, the key's bucket,
 * the row's digest) as new bytes */
static PyObject *
scanned_digests(Fold *f, Py_ssize_t n, Py_ssize_t nk)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 2) * 8);
    if (out == NULL)
        return NULL;
    int64_t *digests = (int64_t *)PyBytes_AS_STRING(out);
    Buf b = {.len = 0, .cap = sizeof(b.stack)}, k = {.len = 0, .cap = sizeof(k.stack)};
    b.p = b.stack;
    k.p = k.stack;
    for (Py_ssize_t i = 0; i < nk; i++) {
        Member *m = f->ksorted[i];
        if (buf_need(&k, m->len + 32) < 0)
            goto fail;
        if (i)
            k.p[k.len++] = ',';
        if (m->null) {
            k.p[k.len++] = '!';
            continue;
        }
        k.len += (size_t)sprintf(k.p + k.len, "%zu:",
                                 utf8_chars(f->key.texts + m->start, m->len));
        memcpy(k.p + k.len, f->key.texts + m->start, m->len);
        k.len += m->len;
    }
    if (buf_need(&b, 1) < 0)
        goto fail;
    b.p[b.len++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        Member *m = f->sorted[i];
        if (buf_need(&b, 5) < 0)
            goto fail;
        if (i)
            b.p[b.len++] = ',';
        if (m->null) {
            memcpy(b.p + b.len, "null", 4);
            b.len += 4;
            digests[i] = (int64_t)PyObject_Hash(Py_None);
            continue;
        }
        const char *t = f->after.texts + m->start;
        Py_hash_t h = text_hash(t, m->len);
        if (h == -1 || buf_string(&b, t, (Py_ssize_t)m->len) < 0)
            goto fail;
        digests[i] = (int64_t)h;
    }
    if (buf_need(&b, 1) < 0)
        goto fail;
    b.p[b.len++] = ']';
    Md5 kmd5, row;
    md5_init(&kmd5);
    md5_update(&kmd5, k.p, k.len);
    row = kmd5;
    uint64_t first = md5_head64(&kmd5);
    digests[n] = (int64_t)(((first >> 32) >> 4) % (uint64_t)f->buckets);
    md5_update(&row, PyBytes_AS_STRING(f->row.head), (size_t)PyBytes_GET_SIZE(f->row.head));
    md5_update(&row, b.p, b.len);
    digests[n + 1] = (int64_t)(md5_head64(&row) >> 4);
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
    return out;
fail:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
    Py_DECREF(out);
    return NULL;
}

/* one message's key and value: folded (1), at or past the cut (2), not the plain case (0:
 * nothing done), error (-1) */
static int
fold_one(Fold *f, PyObject *kb, PyObject *vb)
{
    int res = 0, got;
    PyObject *k = NULL, *pos = NULL, *digests = NULL;
    if (kb == Py_None || !PyBytes_Check(kb) || !PyBytes_Check(vb))
        return 0;
    Envelope env;
    if (!envelope_scan(PyBytes_AS_STRING(vb), PyBytes_AS_STRING(vb) + PyBytes_GET_SIZE(vb),
                       &env))
        return 0; /* the slow way (msgspec) reads it */
    unsigned long long lsn = env.lsn, seq = env.seq;
    if ((got = flat_scan(&f->after, env.after, env.after_end)) <= 0)
        return got;
    if (lsn >= f->cut) {
        res = 2;
        goto done;
    }
    if ((got = flat_scan(&f->key, PyBytes_AS_STRING(kb),
                         PyBytes_AS_STRING(kb) + PyBytes_GET_SIZE(kb))) <= 0) {
        res = got;
        goto done;
    }
    Py_ssize_t n = f->after.n, nk = f->key.n;
    flat_sorted(&f->after, f->sorted);
    flat_sorted(&f->key, f->ksorted);
    if ((k = key_bytes(f, nk)) == NULL) {
        res = -1;
        goto done;
    }
    if (k == Py_None)
        goto done;
    /* from here on the message is folded (1) or an error (-1) */
    res = -1;
    PyObject *hi = PyLong_FromUnsignedLongLong(lsn), *lo = NULL, *shifted = NULL;
    if (hi != NULL && (shifted = PyNumber_Lshift(hi, sixty_four)) != NULL &&
        (lo = PyLong_FromUnsignedLongLong(seq)) != NULL)
        pos = PyNumber_Or(shifted, lo);
    Py_XDECREF(hi);
    Py_XDECREF(shifted);
    Py_XDECREF(lo);
    if (pos == NULL)
        goto done;
    PyObject *held = PyDict_GetItemWithError(f->rows, k);
    if (held == NULL && PyErr_Occurred())
        goto done;
    if (held != NULL && PyTuple_Check(held) && PyTuple_GET_SIZE(held) == 2) {
        int newer = PyObject_RichCompareBool(PyTuple_GET_ITEM(held, 0), pos, Py_GE);
        if (newer < 0)
            goto done;
        if (newer) {
            res = 1; /* a duplicate, or older than what the key holds */
            goto done;
        }
    }
    if (layout_for(&f->row, f->sorted, n) < 0)
        goto done;
    if ((digests = scanned_digests(f, n, nk)) == NULL)
        goto done;
    PyObject *row = PyTuple_Pack(2, f->row.names, digests);
    PyObject *value = row == NULL ? NULL : PyTuple_Pack(2, pos, row);
    Py_XDECREF(row);
    if (value == NULL)
        goto done;
    int bad = PyDict_SetItem(f->rows, k, value);
    Py_DECREF(value);
    if (!bad)
        res = 1;
done:
    Py_XDECREF(k);
    Py_XDECREF(pos);
    Py_XDECREF(digests);
    return res;
}

PyObject *
native_verify_fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyDict_Check(args[2]) || !PyLong_Check(args[3]) || !PyLong_Check(args[4]) ||
        !PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 6) {
        PyErr_SetString(PyExc_TypeError, "verify_fold(msgs: list, ends: dict, rows: dict, "
                                         "cut: int, buckets: int, tools: tuple of 6)");
        return NULL;
    }
    PyObject *tools = args[5], *slow = PyTuple_GET_ITEM(tools, 4);
    static Fold f; /* big (its members' arrays): one a call, under the GIL */
    f.rows = args[2];
    f.row.names = f.row.head = NULL;
    f.row.joined = NULL;
    f.row.jlen = 0;
    f.cut = PyLong_AsUnsignedLongLong(args[3]);
    f.buckets = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (f.buckets <= 0) {
        PyErr_SetString(PyExc_ValueError, "verify_fold: buckets must be positive");
        return NULL;
    }
    Py_ssize_t read = 0, after_cut = 0, folded = 0;
    PyObject *msgs = args[0], *ends = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *kb = NULL, *vb = NULL;
        PyObject *err = PyObject_CallMethodNoArgs(m, s_error);
        if (err == NULL)
            goto fail;
        int skip = err != Py_None;
        Py_DECREF(err);
        if (skip)
            continue;
        PyObject *part = PyObject_CallMethodNoArgs(m, s_partition);
        if (part == NULL)
            goto fail;
        PyObject *end = PyDict_GetItemWithError(ends, part);
        Py_DECREF(part);
        if (end == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        Py_INCREF(end);
        PyObject *off = PyObject_CallMethodNoArgs(m, s_offset);
        int before_end = off == NULL ? -1 : PyObject_RichCompareBool(off, end, Py_LT);
        Py_XDECREF(off);
        Py_DECREF(end);
        if (before_end < 0)
            goto fail;
        if (!before_end)
            continue;
        read++;
        if ((kb = PyObject_CallMethodNoArgs(m, s_key)) == NULL ||
            (vb = PyObject_CallMethodNoArgs(m, s_value)) == NULL) {
            Py_XDECREF(kb);
            goto fail;
        }
        int r = vb == Py_None ? 3 : fold_one(&f, kb, vb);
        if (r == 0) {
            PyObject *done = PyObject_CallFunctionObjArgs(slow, kb, vb, NULL);
            r = done == NULL ? -1 : 0;
            Py_XDECREF(done);
        }
        Py_DECREF(kb);
        Py_DECREF(vb);
        if (r < 0)
            goto fail;
        folded += r == 1;
        after_cut += r == 2;
    }
    layout_clear(&f.row);
    return Py_BuildValue("(nnn)", read, after_cut, folded);
fail:
    layout_clear(&f.row);
    return NULL;
}
