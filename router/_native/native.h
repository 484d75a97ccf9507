/* router._native: the per-change hot path of pgrouter in C, byte for byte what the Python
 * code computes. One extension module built from the C files of router/_native (setup.py):
 *
 *   module.c    configure(), the module and its shared state
 *   pgoutput.c  the slot side: drain (psycopg2's read loop), read_tuple, decode_row,
 *               feed_rows (the transaction assembler's short path), take_row
 *   short.c     take_short (a whole short transaction in one step)
 *   json.h      the output buffer and msgspec's JSON writing
 *   pyrefs.h    what every C file writes for its objects' fields and types (a type's head,
 *               clearing, visiting and freeing fields, argument checks, pairs), written once
 *               (actors/kafka/_producer.c includes it too)
 *   codec.c     the router side: RowCodec (row, key and change JSON)
 *   recorder.c  Recorder (one route's records of a transaction; rebind), OutboxRecorder (an
 *               outbox route's events) and record_run
 *   tx.c        tx_bits (the source fields every record of a transaction shares)
 *   delivery.c  the Kafka side: hand_over (confluent-kafka's produce loop), Tally
 *   avro.c      the Avro sink: AvroConverter (router.formats.avro's conversion of plain records);
 *               avro_values.c its JSON tokens and values (avro_values.h)
 *   verify.c    verify_row (pgrouter verify's digests of a row of a JSON-format topic);
 *               verify.h the verify files' shared declarations, verify_digest.c their base
 *               (MD5, the buffer, a row's texts and digests)
 *   copytext.c  copy_rows (COPY text rows of a snapshot's read); copytext.h its escapes
 *   copyrecords.c  copy_records (a snapshot's COPY text to records, without the GIL)
 *   verify_fold.c  verify_fold (a batch of such a topic's messages folded)
 *   verify_copy.c  verify_copy (the same digests of COPY text rows, summed by bucket)
 *   verify_json.c  the topic's JSON records taken apart for verify_fold
 *
 * Rules these files keep:
 *
 * - It is an accelerator, never the reference. Every function and type has a Python twin
 *   (the one list of them: router.native.TWINS; tests/router/test_native_twins.py compares
 *   each pair) and returns None (or stops early) where its input is anything but the plain
 *   case it was written for (malformed bytes, unchanged-TOAST values, binary values, numbers
 *   PostgreSQL did not print canonically...). The caller then runs the Python twin, which
 *   raises the precise error or handles the rare case. So errors, offsets and odd values
 *   have exactly one implementation.
 * - Output bytes equal msgspec's JSON encoding of the dicts the Python code builds: keys in
 *   order, no spaces, strings escaped as msgspec escapes them (control characters, '"'
 *   and '\\'; \b \t \n \f \r short, the others as \u00xx). tests/router/test_native*.py
 *   and tests/actors/kafka/test_native_io.py compare the two.
 * - No I/O; no global state beyond what configure() is given and interned names.
 */
#ifndef PGROUTER_NATIVE_H
#define PGROUTER_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pyrefs.h"

/* module.c: router.pgoutput's sentinel, column limit and message classes (configure()) */
extern PyObject *unchanged_toast, *insert_type, *update_type, *delete_type;
extern Py_ssize_t max_columns;

/* each part readies its types, interns its names and adds its functions and types */
int pgoutput_setup(PyObject *module);
int codec_setup(PyObject *module);
int records_setup(PyObject *module);
int delivery_setup(PyObject *module);
int avro_setup(PyObject *module);
int copytext_setup(PyObject *module);
int copyrecords_setup(PyObject *module);
int short_setup(PyObject *module); /* short.c, readied after pgoutput_setup (it uses take_row) */
int tx_setup(PyObject *module);    /* tx.c, readied by records_setup */

/* pgrouter verify's functions (verify.h: their shared declarations), in module.c's table:
 * verify_row and verify_sums (verify.c), verify_fold (verify_fold.c), verify_copy
 * (verify_copy.c) */
PyObject *native_verify_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_verify_fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_verify_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_verify_sums(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* pgoutput.c: one plain row message as a Change appended to changes (1), not the plain case
 * (0, nothing appended), error (-1) */
int take_row(PyObject *item, PyObject *changes, PyObject *relations, PyObject *change_type,
             Py_ssize_t overhead, Py_ssize_t value_overhead, long long *used);

/* The escape msgspec writes for a character it escapes (a control character, '"' or
 * '\\'): \b \t \n \f \r \" \\ short, the others as \u00xx; into ``o``, returns the end. */
static inline char *
json_escape(char *o, unsigned char c)
{
    static const char hex[] = "0123456789abcdef";
    *o++ = '\\';
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '\b': *o++ = 'b'; break;
    case '\f': *o++ = 'f'; break;
    case '\n': *o++ = 'n'; break;
    case '\r': *o++ = 'r'; break;
    case '\t': *o++ = 't'; break;
    default:
        *o++ = 'u';
        *o++ = '0';
        *o++ = '0';
        *o++ = hex[c >> 4];
        *o++ = hex[c & 15];
    }
    return o;
}

/* the character the JSON escape \c stands for; -1 for 'u' (four hex digits follow) and
 * for anything that is not an escape */
static inline int
json_unescape(char c)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *at = c ? strchr(from, c) : NULL;
    return at ? to[at - from] : -1;
}

/* ``s`` as a JSON string the way msgspec writes a str, into ``o`` (room for n * 6 + 2
 * bytes reserved by the caller); returns the end. */
static inline char *
json_quote(char *o, const char *s, size_t n)
{
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            *o++ = (char)c;
        else
            o = json_escape(o, c);
    }
    *o++ = '"';
    return o;
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* The length of the UTF-8 sequence of a character >= 0x80 at p (2 to 4) as Python's strict
 * decoder takes it (no overlong forms, no surrogates, nothing past U+10FFFF), 0 when it is
 * not one; ``avail`` bytes are readable at p. */
static inline int
utf8_sequence(const unsigned char *p, Py_ssize_t avail)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    int more;
    if (c >= 0xC2 && c <= 0xDF)
        more = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    }
    else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    }
    else
        return 0;
    if (avail <= more || p[1] < lo || p[1] > hi)
        return 0;
    for (int k = 2; k <= more; k++)
        if ((p[k] & 0xC0) != 0x80)
            return 0;
    return more + 1;
}

/* [p, p + n) is UTF-8 as Python's strict decoder takes it (utf8_sequence): what copy_rows'
 * str() would accept; the Avro string reader's check too. */
static inline int
utf8_valid(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int len = utf8_sequence(p + i, n - i);
        if (!len)
            return 0;
        i += len;
    }
    return 1;
}

/* a hex digit's value, -1 for any other character */
static inline int
hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A record's headers: [lsn_header, (seq_name, b"<seq>")], untracked by the collector (it
 * holds only atoms); NULL with an exception set. */
static inline PyObject *
seq_headers(PyObject *lsn_header, PyObject *seq_name, unsigned long long seq)
{
    char digits[24];
    int n = snprintf(digits, sizeof(digits), "%llu", seq);
    PyObject *headers = PyList_New(2);
    PyObject *seq_header = headers == NULL ? NULL
        : native_pair(Py_NewRef(seq_name), PyBytes_FromStringAndSize(digits, n));
    if (seq_header == NULL) {
        Py_XDECREF(headers);
        return NULL;
    }
    PyList_SET_ITEM(headers, 0, Py_NewRef(lsn_header));
    PyList_SET_ITEM(headers, 1, seq_header);
    PyObject_GC_UnTrack(seq_header);
    PyObject_GC_UnTrack(headers);
    return headers;
}

#endif
