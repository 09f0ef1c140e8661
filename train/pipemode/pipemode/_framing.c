/* pipemode._framing: TFRecord framing and CRC checks for one chunk of a stream, in C.

   The optional fast path of pipemode.tfrecord.TFRecordDecoder. In Python, framing a 1 KB record
   costs ~0.28 us (unpacking its header, slicing it out) and checking its CRC ~0.25 us more (a call
   per record), which made the reader's thread the slowest step of a pipeline fed 1 KB records.
   Here a chunk is framed and checked, and its records made into bytes objects, in one call: 1 KB
   records through bench/aws/read_fifo.py (a FIFO fed by cat, batch_size=1024), median of 5,
   1.15 s per GB against 1.91 s for the pure-Python decoder.

   It only ever accepts: it stops at the first record whose header or data does not check out and
   leaves it, and everything after it in the chunk, to the Python decoder, which reports or skips
   it with its number and byte offset exactly as it does without this module.

   CRC-32C: google-crc32c computes it at ~28 GB/s (three interleaved streams), but a Python call
   per record costs ~0.1 us, as much as the CRC of a 1 KB record itself. So records up to
   SMALL_RECORD_BYTES are checked here with the SSE4.2 crc32 instruction (one stream, ~10 GB/s,
   no call), longer ones through google-crc32c's own function (the `crc` argument), where the call
   is cheap next to the work. Without SSE4.2 (other CPUs), every data CRC of more than 64 bytes goes
   through `crc`; the 8-byte length fields and shorter records use a table. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

#define HEADER_BYTES 12
#define FOOTER_BYTES 4
#define SMALL_RECORD_BYTES 2048 /* measured break-even of the two CRCs above: ~1.5 KB */
#define MASK_DELTA 0xa282ead8u

static uint32_t crc_table[256];
static int cpu_has_sse42 = 0; /* what the CPU offers */
static int have_sse42 = 0;    /* what is used: the tests turn it off to check the table path */

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c_table(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(const uint8_t *p, size_t n) {
    uint64_t c = 0xffffffffu;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xffffffffu;
}
#endif

static inline uint32_t small_crc32c(const uint8_t *p, size_t n) {
#ifdef HAVE_SSE42_PATH
    if (have_sse42) return crc32c_sse42(p, n);
#endif
    return crc32c_table(p, n);
}

/* Whether a record's data CRC is computed here rather than by google-crc32c: short ones only, and
   without SSE4.2 only those short enough for the table to beat a Python call. */
static inline int checked_here(uint64_t length) {
    return length <= SMALL_RECORD_BYTES && (have_sse42 || length <= 64);
}

static inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + MASK_DELTA; }

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v; /* TFRecord is little-endian, as are the CPUs TensorFlow runs on */
}

/* Whether `record` (a bytes object) has masked CRC `stored`, through the Python function `crc`.
   -1 on error (an exception is set). */
static int check_with(PyObject *crc, PyObject *record, uint32_t stored) {
    PyObject *value = PyObject_CallOneArg(crc, record);
    if (value == NULL) return -1;
    unsigned long c = PyLong_AsUnsignedLong(value);
    Py_DECREF(value);
    if (c == (unsigned long)-1 && PyErr_Occurred()) return -1;
    return masked((uint32_t)c) == stored;
}

PyDoc_STRVAR(scan_doc,
"scan(buf, pos, max_record_bytes, crc) -> (records, pos, clean)\n\n"
"Cuts the complete TFRecords out of buf[pos:], checking both CRCs of each (crc: google_crc32c.value,\n"
"used for records longer than 2 KB). Returns the records as a list of bytes, the offset of the\n"
"first byte not consumed, and clean: True if it stopped only for want of bytes (a record runs past\n"
"the end of buf), False if it stopped at a record whose length, length CRC or data CRC is wrong,\n"
"which then starts at pos.");

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "scan(buf: bytes, pos: int, max_record_bytes: int, crc: callable)");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    const Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    const unsigned long long max_length = PyLong_AsUnsignedLongLong(args[2]);
    if (max_length == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (pos < 0 || pos > size) {
        PyErr_SetString(PyExc_ValueError, "pos is outside buf");
        return NULL;
    }
    PyObject *crc = args[3];
    PyObject *records = PyList_New(0);
    if (records == NULL) return NULL;
    int clean = 1;
    while (size - pos >= HEADER_BYTES) {
        uint64_t length;
        memcpy(&length, buf + pos, 8);
        if (length > max_length || masked(small_crc32c(buf + pos, 8)) != load_u32(buf + pos + 8)) {
            clean = 0;
            break;
        }
        const Py_ssize_t start = pos + HEADER_BYTES;
        const uint64_t left = (uint64_t)(size - start);
        if (length > left || left - length < FOOTER_BYTES) break; /* runs past the chunk */
        const Py_ssize_t end = start + (Py_ssize_t)length;
        const uint32_t stored = load_u32(buf + end);
        PyObject *record = PyBytes_FromStringAndSize((const char *)buf + start, (Py_ssize_t)length);
        if (record == NULL) goto error;
        const int good = checked_here(length) ? masked(small_crc32c(buf + start, (size_t)length)) == stored
                                              : check_with(crc, record, stored);
        if (good != 1) {
            Py_DECREF(record);
            if (good < 0) goto error;
            clean = 0;
            break;
        }
        int appended = PyList_Append(records, record);
        Py_DECREF(record);
        if (appended < 0) goto error;
        pos = end + FOOTER_BYTES;
    }
    return Py_BuildValue("(NnO)", records, pos, clean ? Py_True : Py_False);
error:
    Py_DECREF(records);
    return NULL;
}

PyDoc_STRVAR(find_header_doc,
"find_header(buf, start, max_record_bytes) -> int\n\n"
"The first offset from start on where a whole, valid TFRecord header starts in buf (a length of at\n"
"most max_record_bytes followed by its masked CRC-32C), or -1: pipemode.tfrecord.find_header, a\n"
"byte at a time in C (with SSE4.2, ~1 ns an offset), without the GIL.");

static PyObject *find_header(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "find_header(buf: bytes, start: int, max_record_bytes: int)");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    const Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    const Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    const unsigned long long max_length = PyLong_AsUnsignedLongLong(args[2]);
    if (max_length == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        return NULL;
    }
    Py_ssize_t found = -1;
    Py_BEGIN_ALLOW_THREADS /* (buf is a bytes object the caller holds: it cannot change) */
    for (Py_ssize_t pos = start; size - pos >= HEADER_BYTES; pos++) {
        uint64_t length;
        memcpy(&length, buf + pos, 8);
        if (length <= max_length && masked(small_crc32c(buf + pos, 8)) == load_u32(buf + pos + 8)) {
            found = pos;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(found);
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data) -> int: the CRC-32C of a bytes-like object, as computed for records up to 2 KB.");

static PyObject *crc32c_py(PyObject *Py_UNUSED(self), PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = small_crc32c((const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

PyDoc_STRVAR(use_hardware_crc_doc,
"use_hardware_crc(enabled) -> bool: use SSE4.2 where the CPU has it (the default), or the table\n"
"path that other CPUs take (for tests). Returns whether hardware CRCs are now in use.");

static PyObject *use_hardware_crc(PyObject *Py_UNUSED(self), PyObject *enabled) {
    int flag = PyObject_IsTrue(enabled);
    if (flag < 0) return NULL;
    have_sse42 = flag && cpu_has_sse42;
    return PyBool_FromLong(have_sse42);
}

static PyMethodDef methods[] = {
    {"use_hardware_crc", use_hardware_crc, METH_O, use_hardware_crc_doc},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL, scan_doc},
    {"find_header", (PyCFunction)(void (*)(void))find_header, METH_FASTCALL, find_header_doc},
    {"crc32c", crc32c_py, METH_O, crc32c_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "pipemode._framing",
    .m_doc = "TFRecord framing and CRC checks for one chunk, in C (the optional fast path of pipemode.tfrecord).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__framing(void) {
    make_table();
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    cpu_has_sse42 = __builtin_cpu_supports("sse4.2") != 0;
    have_sse42 = cpu_has_sse42;
#endif
    return PyModule_Create(&module);
}
