/* COPY text fields undone in pure C (copytext.c's copy_rows and copyrecords.c's
 * copy_records, which runs without the GIL): one implementation of the escapes. */
#ifndef PGROUTER_NATIVE_COPYTEXT_H
#define PGROUTER_NATIVE_COPYTEXT_H

#include "../native.h"

#include <ctype.h>

/* The text of a field [p, p + n) holding a backslash (not ``\N``) into ``scratch`` (room for
 * n bytes): the escapes \b \f \n \r \t \v \\ and a backslash before any other character
 * (that character) undone, a trailing backslash kept. Its length, or -1 to decline: octal or
 * hex escapes (COPY never writes them), a backslash before a multibyte character. */
static inline Py_ssize_t
copy_unescape(const char *p, Py_ssize_t n, char *scratch)
{
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\\' || i + 1 == n) {
            scratch[o++] = c;
            continue;
        }
        char e = p[++i];
        switch (e) {
        case 'b': scratch[o++] = '\b'; break;
        case 'f': scratch[o++] = '\f'; break;
        case 'n': scratch[o++] = '\n'; break;
        case 'r': scratch[o++] = '\r'; break;
        case 't': scratch[o++] = '\t'; break;
        case 'v': scratch[o++] = '\v'; break;
        case 'x':
            if (i + 1 < n && isxdigit((unsigned char)p[i + 1]))
                return -1;
            scratch[o++] = e;
            break;
        default:
            if (e >= '0' && e <= '7')
                return -1;
            if ((unsigned char)e >= 0x80) /* a backslash before a multibyte character */
                return -1;
            scratch[o++] = e;
        }
    }
    return o;
}

#endif
