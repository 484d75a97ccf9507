/* One value of pgrouter's JSON envelope as its Avro datum: router.formats.avro_types' converters
 * and writers for the plain forms PostgreSQL prints, in C. Anything else is declined (AV_DECLINE)
 * and the Python converter decides, so what is written here is what Python writes:
 *
 * - integers: JSON integers within int64; floats: JSON numbers up to 1e308 in magnitude and
 *   the strings "NaN", "Infinity", "-Infinity" (null); booleans: true and false;
 * - strings: any JSON string (valid UTF-8, escapes and surrogate pairs as msgspec reads them);
 *   bytea: "\x" and pairs of hex digits, or any other text as its UTF-8;
 * - numeric: -?digits(.digits)? with at most 38 digits unscaled (18 where the compiler has
 *   no __int128) and, typmod'd, at most `scale` fraction digits (Python rounds more);
 *   "NaN" and ±"Infinity" are null;
 * - date "YYYY-MM-DD", timestamp "YYYY-MM-DD HH:MM:SS[.f{1,6}]" (timestamptz also with an
 *   offset ±HH[:MM[:SS]]; not in years 1 and 9999, where Python's conversion to UTC may
 *   overflow), time "HH:MM:SS[.f{1,6}]" or "24:..." (a day); "infinity" and "-infinity"
 *   dates and timestamps are null.
 */
#include "avro_values.h"

#include <math.h>
#if defined(__GLIBC__)
#define AVRO_NOGIL 1
#include <locale.h>
#include <stdlib.h>
#endif

/* -- JSON tokens --------------------------------------------------------------------------- */

/* eight bytes at a time: whether any is one of '"', '\\' or below 0x20 (exact: the tricks
 * of "Bit Twiddling Hacks", haszero and hasless) */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static inline uint64_t
load8(const char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static inline int
has_special(uint64_t w)
{
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return ((((w - ONES * 0x20) & ~w) | ((q - ONES) & ~q) | ((b - ONES) & ~b)) & HIGHS) != 0;
}

const char *
avro_skip_string(const char *p, const char *end)
{
    p++;
    while (end - p >= 8 && !has_special(load8(p)))
        p += 8;
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c == '\\')
            p++;
        else if (c < 0x20)
            return NULL;
    }
    return NULL;
}

static inline int
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* a JSON number; *is_int: without fraction and exponent */
static const char *
skip_number(const char *p, const char *end, int *is_int)
{
    if (p < end && *p == '-')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && is_digit(*p))
            p++;
    else
        return NULL;
    *is_int = 1;
    if (p < end && *p == '.') {
        if (++p >= end || !is_digit(*p))
            return NULL;
        while (p < end && is_digit(*p))
            p++;
        *is_int = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit(*p))
            return NULL;
        while (p < end && is_digit(*p))
            p++;
        *is_int = 0;
    }
    return p;
}

static const char *
skip_literal(const char *p, const char *end, const char *lit, Py_ssize_t n)
{
    return end - p >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

const char *
avro_skip_value(const char *p, const char *end, int depth)
{
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"':
        return avro_skip_string(p, end);
    case 't':
        return skip_literal(p, end, "true", 4);
    case 'f':
        return skip_literal(p, end, "false", 5);
    case 'n':
        return skip_literal(p, end, "null", 4);
    case '{':
    case '[': {
        char close = *p == '{' ? '}' : ']';
        if (depth > 32)
            return NULL;
        if (++p < end && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (p >= end || *p != '"')
                    return NULL;
                p = avro_skip_string(p, end);
                if (p == NULL || p >= end || *p != ':')
                    return NULL;
                p++;
            }
            p = avro_skip_value(p, end, depth + 1);
            if (p == NULL || p >= end)
                return NULL;
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    default: {
        int is_int;
        return skip_number(p, end, &is_int);
    }
    }
}

int
avro_int64(Span t, int64_t *out)
{
    Py_ssize_t i = 0;
    int neg = t.n > 0 && t.p[0] == '-';
    i = neg;
    if (i == t.n || t.n - i > 19 || (t.p[i] == '0' && t.n - i > 1))
        return 0;
    uint64_t v = 0;
    for (; i < t.n; i++) {
        if (!is_digit(t.p[i]))
            return 0;
        v = v * 10 + (uint64_t)(t.p[i] - '0');
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return 0;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    }
    else {
        if (v > (uint64_t)INT64_MAX)
            return 0;
        *out = (int64_t)v;
    }
    return 1;
}

/* -- strings ------------------------------------------------------------------------------- */

static int
hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (is_digit(c))
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

static char *
put_utf8(char *w, unsigned cp)
{
    if (cp < 0x80)
        *w++ = (char)cp;
    else if (cp < 0x800) {
        *w++ = (char)(0xC0 | (cp >> 6));
        *w++ = (char)(0x80 | (cp & 0x3F));
    }
    else if (cp < 0x10000) {
        *w++ = (char)(0xE0 | (cp >> 12));
        *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    }
    else {
        *w++ = (char)(0xF0 | (cp >> 18));
        *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    }
    return w;
}

/* the escapes of a string's content into tmp (never longer than the content) */
static int
unescape(const char *p, const char *end, Out *tmp)
{
    tmp->len = 0;
    if (tmp->cap < end - p && out_grow(tmp, end - p) < 0)
        return -1;
    char *w = tmp->p;
    while (p < end) {
        if (*p != '\\') {
            *w++ = *p++;
            continue;
        }
        if (end - p < 2)
            return 0;
        char c = p[1];
        p += 2;
        int plain = json_unescape(c);
        if (plain >= 0) {
            *w++ = (char)plain;
            continue;
        }
        if (c != 'u')
            return 0;
        unsigned cp, lo;
        if (end - p < 4 || !hex4(p, &cp))
            return 0;
        p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return 0; /* a lone low surrogate */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return 0; /* a lone high surrogate */
            p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        w = put_utf8(w, cp);
    }
    tmp->len = w - tmp->p;
    return 1;
}

int
avro_string(Span t, Out *tmp, const char **s, Py_ssize_t *len)
{
    if (t.n < 2 || t.p[0] != '"')
        return 0;
    const char *p = t.p + 1, *end = t.p + t.n - 1, *q = p;
    int escaped = 0, high = 0;
    uint64_t words = 0;
    for (; end - q >= 8; q += 8) {
        uint64_t w = load8(q), b = w ^ (ONES * '\\');
        words |= (w | ((b - ONES) & ~b)) & HIGHS;
    }
    if (words) /* a backslash or a byte >= 0x80 in there: the bytes say which */
        q = p;
    for (; q < end; q++) {
        escaped |= *q == '\\';
        high |= (unsigned char)*q >= 0x80;
    }
    if (escaped) {
        int r = unescape(p, end, tmp);
        if (r <= 0)
            return r;
        p = tmp->p;
        end = p + tmp->len;
    }
    if (high && !utf8_valid((const unsigned char *)p, end - p))
        return 0;
    *s = p;
    *len = end - p;
    return 1;
}

/* -- Avro binary --------------------------------------------------------------------------- */

int
avro_bytes(Out *o, const char *s, Py_ssize_t n)
{
    return avro_long(o, n) < 0 ? -1 : out_write(o, s, n);
}

#define WROTE(expr) ((expr) < 0 ? -1 : AV_OK)

/* -- numbers ------------------------------------------------------------------------------- */

/* float() of a JSON number's text (NUL-terminated), correctly rounded as Python's is, and
 * callable without the GIL: glibc's strtod in the "C" locale (any other C library: only with
 * the GIL, through Python's own) */
#ifdef AVRO_NOGIL
static locale_t c_locale;

static int
text_to_double(const char *buf, double *x)
{
    *x = strtod_l(buf, NULL, c_locale);
    return 0;
}
#else
static int
text_to_double(const char *buf, double *x)
{
    *x = PyOS_string_to_double(buf, NULL, NULL);
    if (*x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}
#endif

int
avro_values_nogil(void)
{
#ifdef AVRO_NOGIL
    return 1;
#else
    return 0;
#endif
}

int
avro_values_setup(void)
{
#ifdef AVRO_NOGIL
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c_locale == (locale_t)0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
#endif
    return 0;
}

/* IEEE 754 little-endian, as PyFloat_Pack4/Pack8(x, b, 1) (no Python error: a double too
 * large for a float is -1) */
static int
pack_le(double x, int four, unsigned char *b)
{
    if (four) {
        float y = (float)x;
        if (isinf(y) && !isinf(x))
            return -1;
        uint32_t u;
        memcpy(&u, &y, 4);
        for (int i = 0; i < 4; i++)
            b[i] = (unsigned char)(u >> (8 * i));
        return 0;
    }
    uint64_t u;
    memcpy(&u, &x, 8);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(u >> (8 * i));
    return 0;
}

static int
datum_float(Out *o, Span t, int four)
{
    if (t.p[0] == '"')
        return SPAN_IS(t, "\"NaN\"") || SPAN_IS(t, "\"Infinity\"") ||
               SPAN_IS(t, "\"-Infinity\"") ? AV_NONE : AV_DECLINE;
    int is_int;
    char buf[48];
    if (t.n >= (Py_ssize_t)sizeof(buf) || skip_number(t.p, t.p + t.n, &is_int) != t.p + t.n)
        return AV_DECLINE;
    double x = 0.0;
    /* msgspec reads an integer as an int and float() of it is correctly rounded, as strtod
     * is; only -0 differs (float(0) is +0.0) */
    int zero = is_int;
    for (Py_ssize_t i = 0; zero && i < t.n; i++)
        zero = t.p[i] == '-' || t.p[i] == '0';
    if (!zero) {
        memcpy(buf, t.p, t.n);
        buf[t.n] = '\0';
        if (text_to_double(buf, &x) < 0)
            return AV_DECLINE;
    }
    if (!(fabs(x) <= 1e308)) /* near the top msgspec says "out of range" */
        return AV_DECLINE;
    unsigned char b[8];
    if (pack_le(x, four, b) < 0) /* too large for a float: Python raises */
        return AV_DECLINE;
    return WROTE(out_write(o, (const char *)b, four ? 4 : 8));
}

#ifdef __SIZEOF_INT128__
typedef __int128 unscaled_t;
typedef unsigned __int128 unscaled_mag_t;
#define MAX_UNSCALED 38 /* digits an __int128 holds */
#else
typedef int64_t unscaled_t;
typedef uint64_t unscaled_mag_t;
#define MAX_UNSCALED 18
#endif

/* numeric text as its unscaled integer: at `scale` (A_DECIMAL) or at its own fraction
 * digits, returned in *scale (A_VSD: scale < 0) */
static int
parse_decimal(const char *s, Py_ssize_t n, int *scale, unscaled_t *out)
{
    Py_ssize_t i = s[0] == '-';
    int neg = (int)i, sig = 0, frac = -1, digits = 0;
    unscaled_t v = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (frac >= 0 || digits == 0)
                return 0;
            frac = 0;
            continue;
        }
        if (!is_digit(c))
            return 0;
        digits++;
        if ((sig || c != '0') && ++sig > MAX_UNSCALED)
            return 0;
        v = v * 10 + (c - '0');
        if (frac >= 0)
            frac++;
    }
    if (digits == 0 || frac == 0)
        return 0;
    if (frac < 0)
        frac = 0;
    if (*scale < 0)
        *scale = frac;
    else {
        /* more fraction digits than the scale: Python rounds half-even; not PostgreSQL's */
        if (frac > *scale || sig + (*scale - frac) > MAX_UNSCALED)
            return 0;
        for (int k = frac; k < *scale; k++)
            v *= 10;
    }
    *out = neg ? -v : v;
    return 1;
}

/* Python's n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True) */
static int
write_unscaled(Out *o, unscaled_t v)
{
    unscaled_mag_t mag = v < 0 ? -(unscaled_mag_t)v : (unscaled_mag_t)v;
    int bits = 0;
    while (mag) {
        bits++;
        mag >>= 1;
    }
    int len = (bits + 8) / 8;
    char buf[17];
    for (int i = 0; i < len; i++)
        buf[len - 1 - i] = (char)(unsigned char)(v >> (8 * i));
    return avro_bytes(o, buf, len);
}

static int
datum_decimal(Out *o, const char *s, Py_ssize_t n, long param, int variable)
{
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
        (n == 9 && memcmp(s, "-Infinity", 9) == 0))
        return AV_NONE;
    int scale = variable ? -1 : (int)param;
    unscaled_t v;
    if (n == 0 || param < 0 || param > MAX_UNSCALED || !parse_decimal(s, n, &scale, &v))
        return AV_DECLINE;
    if (variable && avro_long(o, scale) < 0)
        return -1;
    return WROTE(write_unscaled(o, v));
}

/* -- dates and times ----------------------------------------------------------------------- */

static int
num(const char *s, int k, int *out)
{
    int v = 0;
    for (int i = 0; i < k; i++) {
        if (!is_digit(s[i]))
            return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm) */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD" (years 1-9999) at s */
static int
parse_date(const char *s, Py_ssize_t n, int64_t *days, int *year)
{
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, m, d;
    if (n < 10 || !num(s, 4, &y) || s[4] != '-' || !num(s + 5, 2, &m) || s[7] != '-' ||
        !num(s + 8, 2, &d))
        return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > mdays[m - 1] + (m == 2 && leap))
        return 0;
    *days = days_from_civil(y, m, d);
    *year = y;
    return 1;
}

/* "HH:MM:SS[.f{1,6}]" at s: microseconds of the day; the characters used in *used */
static int
parse_time(const char *s, Py_ssize_t n, int64_t *micros, Py_ssize_t *used)
{
    int h, m, sec, frac = 0;
    if (n < 8 || !num(s, 2, &h) || s[2] != ':' || !num(s + 3, 2, &m) || s[5] != ':' ||
        !num(s + 6, 2, &sec) || h > 23 || m > 59 || sec > 59)
        return 0;
    Py_ssize_t i = 8;
    if (i < n && s[i] == '.') {
        int k = 0;
        for (i++; i < n && is_digit(s[i]); i++, k++) {
            if (k == 6)
                return 0; /* Python truncates beyond 6 digits; PostgreSQL prints at most 6 */
            frac = frac * 10 + (s[i] - '0');
        }
        if (k == 0)
            return 0;
        for (; k < 6; k++)
            frac *= 10;
    }
    *micros = ((int64_t)(h * 60 + m) * 60 + sec) * 1000000 + frac;
    *used = i;
    return 1;
}

static int
floor_div(int64_t a, int64_t b, int64_t *q)
{
    *q = a / b - (a % b != 0 && (a < 0) != (b < 0));
    return 1;
}

/* a timestamp's microseconds since 1970 (local: as it reads; utc: at UTC, after its offset) */
static int
parse_timestamp(const char *s, Py_ssize_t n, int utc, int64_t *micros)
{
    int64_t days, tod;
    int year;
    Py_ssize_t used;
    if (!parse_date(s, n, &days, &year) || n < 11 || (s[10] != ' ' && s[10] != 'T') ||
        !parse_time(s + 11, n - 11, &tod, &used))
        return 0;
    *micros = days * 86400 * 1000000 + tod;
    Py_ssize_t i = 11 + used;
    if (i == n)
        return 1;
    /* an offset: timestamptz (Python refuses to subtract an aware datetime from the epoch) */
    if (!utc || year <= 1 || year >= 9999 || (s[i] != '+' && s[i] != '-'))
        return 0;
    int sign = s[i] == '-' ? -1 : 1, hh, mm = 0, ss = 0;
    Py_ssize_t rest = n - i - 1;
    const char *z = s + i + 1;
    if (!(rest == 2 || rest == 5 || rest == 8) || !num(z, 2, &hh) ||
        (rest >= 5 && (z[2] != ':' || !num(z + 3, 2, &mm))) ||
        (rest == 8 && (z[5] != ':' || !num(z + 6, 2, &ss))) || hh > 23 || mm > 59 || ss > 59)
        return 0;
    *micros -= sign * ((int64_t)(hh * 60 + mm) * 60 + ss) * 1000000;
    return 1;
}

static int
datum_time(Out *o, int kind, const char *s, Py_ssize_t n)
{
    int64_t v;
    Py_ssize_t used;
    int64_t day;
    int year;
    switch (kind) {
    case A_DATE:
        if (n != 10 || !parse_date(s, n, &day, &year))
            return AV_DECLINE;
        return WROTE(avro_long(o, day));
    case A_TIME_MICROS:
    case A_TIME_MILLIS:
        if (n >= 3 && memcmp(s, "24:", 3) == 0) /* router.formats.connect._micro_time */
            v = 86400LL * 1000000;
        else if (!parse_time(s, n, &v, &used) || used != n)
            return AV_DECLINE;
        break;
    default: /* timestamps */
        if (!parse_timestamp(s, n, kind == A_TS_UTC_MICROS || kind == A_TS_UTC_MILLIS, &v))
            return AV_DECLINE;
    }
    if (kind == A_TIME_MILLIS || kind == A_TS_LOCAL_MILLIS || kind == A_TS_UTC_MILLIS)
        floor_div(v, 1000, &v);
    return WROTE(avro_long(o, v));
}

/* -- one value ----------------------------------------------------------------------------- */

static int
datum_bytea(Out *o, const char *s, Py_ssize_t n)
{
    if (n < 2 || s[0] != '\\' || s[1] != 'x')
        return WROTE(avro_bytes(o, s, n)); /* not hex: its text (router.formats.avro_types._bytea) */
    Py_ssize_t len = (n - 2) / 2;
    if ((n - 2) % 2 || avro_long(o, len) < 0)
        return (n - 2) % 2 ? AV_DECLINE : -1;
    if (o->cap - o->len < len && out_grow(o, len) < 0)
        return -1;
    char *w = o->p + o->len;
    for (Py_ssize_t i = 2; i < n; i += 2) {
        int hi = hex_value(s[i]), lo = hex_value(s[i + 1]);
        if (hi < 0 || lo < 0)
            return AV_DECLINE; /* the caller drops what was written */
        *w++ = (char)(hi << 4 | lo);
    }
    o->len += len;
    return AV_OK;
}

int
avro_datum(Out *o, Out *tmp, int kind, long param, Span t)
{
    int64_t v;
    const char *s;
    Py_ssize_t n;
    switch (kind) {
    case A_LONG:
        return avro_int64(t, &v) ? WROTE(avro_long(o, v)) : AV_DECLINE;
    case A_FLOAT:
    case A_DOUBLE:
        return datum_float(o, t, kind == A_FLOAT);
    case A_BOOL:
        if (SPAN_IS(t, "true") || SPAN_IS(t, "false"))
            return WROTE(out_write(o, t.n == 4 ? "\x01" : "\x00", 1));
        return AV_DECLINE;
    case A_OTHER:
        return AV_DECLINE;
    }
    if (kind >= A_KINDS)
        return AV_DECLINE;
    int r = avro_string(t, tmp, &s, &n);
    if (r <= 0)
        return r;
    switch (kind) {
    case A_STRING:
        return WROTE(avro_bytes(o, s, n));
    case A_BYTEA:
        return datum_bytea(o, s, n);
    case A_DECIMAL:
    case A_VSD:
        return datum_decimal(o, s, n, param, kind == A_VSD);
    }
    if ((n == 8 && memcmp(s, "infinity", 8) == 0) || (n == 9 && memcmp(s, "-infinity", 9) == 0))
        return kind == A_TIME_MICROS || kind == A_TIME_MILLIS ? AV_DECLINE : AV_NONE;
    return datum_time(o, kind, s, n);
}
