/*
 * A stand-in for libcupti, for testing the injection library's runtime without a GPU: it
 * implements the CUPTI entry points the library calls, remembers what it was asked to enable,
 * and lets the test play API callbacks and deliver activity buffers exactly as CUPTI would
 * (buffers requested from and completed through the registered callbacks). Built by the test
 * with `cc -shared` under the soname libcupti.so.13.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUptiResult;
typedef void (*CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*BufferRequested)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*BufferCompleted)(void *context, uint32_t stream, uint8_t *buffer, size_t size,
                                size_t valid);

enum { SUCCESS = 0, INVALID_PARAMETER = 1, MAX_LIMIT_REACHED = 3, MULTIPLE_SUBSCRIBERS = 39 };

static CallbackFunc g_callback;
static void *g_userdata;
static int g_subscribed;
static BufferRequested g_requested;
static BufferCompleted g_completed;
static uint64_t g_now = 1000000000ull;
static int g_enabled[3][16];
static int g_kinds[64];
static int g_api_records[3][16];
static int g_forced_flushes;
static size_t g_dropped;
static size_t g_offsets[64];
static size_t g_count;

/* Callback ids of this fake: driver 1..5, runtime 1..2. */
static const char *driver_names[] = {0, "cuMemcpyHtoD_v2", "cuLaunchKernel", "cuStreamSynchronize",
                                     "cuCtxGetCurrent", "cuProfilerStop"};
static const char *runtime_names[] = {0, "cudaMemcpy_v3020", "cudaLaunchKernel_v7000"};

CUptiResult cuptiGetVersion(uint32_t *version) { *version = 130500; return SUCCESS; }

CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
    (void)result;
    *str = "CUPTI_ERROR_FAKE";
    return SUCCESS;
}

static int g_as_13_0_without_driver;
/* Behaves as CUPTI 13.0.85 with no driver: cuptiGetVersion answers, cuptiSubscribe fails. */
void fake_as_13_0_without_driver(void) { g_as_13_0_without_driver = 1; }

CUptiResult cuptiSubscribe(void **subscriber, CallbackFunc callback, void *userdata) {
    if (g_as_13_0_without_driver) return 999; /* CUPTI_ERROR_UNKNOWN */
    if (g_subscribed) return MULTIPLE_SUBSCRIBERS;
    g_subscribed = 1;
    g_callback = callback;
    g_userdata = userdata;
    *subscriber = (void *)0x1;
    return SUCCESS;
}

CUptiResult cuptiUnsubscribe(void *subscriber) {
    (void)subscriber;
    g_subscribed = 0;
    g_callback = 0;
    return SUCCESS;
}

CUptiResult cuptiGetCallbackName(int domain, uint32_t cbid, const char **name) {
    if (domain == 1 && cbid >= 1 && cbid <= 5) { *name = driver_names[cbid]; return SUCCESS; }
    if (domain == 2 && cbid >= 1 && cbid <= 2) { *name = runtime_names[cbid]; return SUCCESS; }
    return INVALID_PARAMETER;
}

CUptiResult cuptiEnableCallback(uint32_t enable, void *subscriber, int domain, uint32_t cbid) {
    (void)subscriber;
    if (domain < 1 || domain > 2 || cbid >= 16) return INVALID_PARAMETER;
    g_enabled[domain][cbid] = (int)enable;
    return SUCCESS;
}

CUptiResult cuptiActivityRegisterCallbacks(BufferRequested requested, BufferCompleted completed) {
    g_requested = requested;
    g_completed = completed;
    return SUCCESS;
}

static int g_fail_kind = -1;
/* Makes cuptiActivityEnable fail for `kind` (-1: never), to test a start that fails half-way. */
void fake_fail_kind(int kind) { g_fail_kind = kind; }

CUptiResult cuptiActivityEnable(int kind) {
    if (kind < 0 || kind >= 64 || kind == g_fail_kind) return INVALID_PARAMETER;
    g_kinds[kind] = 1;
    return SUCCESS;
}

CUptiResult cuptiActivityDisable(int kind) {
    if (kind < 0 || kind >= 64) return INVALID_PARAMETER;
    g_kinds[kind] = 0;
    /* Disabling the API kinds also ends their per-function records. */
    if (kind == 4 || kind == 5) memset(g_api_records[kind == 4 ? 1 : 2], 0, sizeof g_api_records[0]);
    return SUCCESS;
}

static int g_fail_api_records = 0;
void fake_fail_api_records(void) { g_fail_api_records = 1; }

CUptiResult cuptiActivityEnableDriverApi(uint32_t cbid, uint8_t enable) {
    if (cbid >= 16 || g_fail_api_records) return INVALID_PARAMETER;
    g_api_records[1][cbid] = enable;
    return SUCCESS;
}

CUptiResult cuptiActivityEnableRuntimeApi(uint32_t cbid, uint8_t enable) {
    if (cbid >= 16) return INVALID_PARAMETER;
    g_api_records[2][cbid] = enable;
    return SUCCESS;
}

/* Whether API activity records of one function were enabled on their own. */
int fake_api_records_enabled(int domain, uint32_t cbid) {
    return domain >= 1 && domain <= 2 && cbid < 16 ? g_api_records[domain][cbid] : 0;
}

/* Whether any activity kind is enabled, and whether a callback subscriber is registered. */
int fake_any_kind_enabled(void) {
    for (int k = 0; k < 64; k++)
        if (g_kinds[k]) return 1;
    return 0;
}
int fake_subscribed(void) { return g_subscribed; }

static int g_flush_ms;
static int g_in_flush;
static int g_overlapping_flushes;

/* Makes every flush take `ms` milliseconds, as a flush that processes many buffers does. */
void fake_slow_flush(int ms) { g_flush_ms = ms; }
/* Whether a flush is running now. */
int fake_in_flush(void) { return __atomic_load_n(&g_in_flush, __ATOMIC_SEQ_CST); }

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    if (__atomic_add_fetch(&g_in_flush, 1, __ATOMIC_SEQ_CST) > 1)
        __atomic_add_fetch(&g_overlapping_flushes, 1, __ATOMIC_SEQ_CST);
    if (flag != 0) __atomic_add_fetch(&g_forced_flushes, 1, __ATOMIC_SEQ_CST);
    if (g_flush_ms > 0) {
        struct timespec t = {g_flush_ms / 1000, (long)(g_flush_ms % 1000) * 1000000L};
        nanosleep(&t, 0);
    }
    __atomic_sub_fetch(&g_in_flush, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

/* After the program's exit handlers (the library's included): how flushes overlapped. */
__attribute__((destructor)) static void fake_report(void) {
    if (g_flush_ms > 0) {
        char line[96];
        int n = snprintf(line, sizeof line, "fake-cupti: %d overlapping flushes, %d forced\n",
                         __atomic_load_n(&g_overlapping_flushes, __ATOMIC_SEQ_CST),
                         __atomic_load_n(&g_forced_flushes, __ATOMIC_SEQ_CST));
        if (n > 0) (void)!write(2, line, (size_t)n);
    }
}

CUptiResult cuptiActivityGetNumDroppedRecords(void *context, uint32_t stream, size_t *dropped) {
    (void)context;
    (void)stream;
    *dropped = g_dropped;
    g_dropped = 0;
    return SUCCESS;
}

static int g_fail_timestamp;
void fake_fail_timestamp(void) { g_fail_timestamp = 1; }
CUptiResult cuptiGetTimestamp(uint64_t *timestamp) {
    if (g_fail_timestamp) return 1; /* CUPTI_ERROR_INVALID_PARAMETER */
    *timestamp = g_now;
    return SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    size_t next = 0;
    if (*record) {
        size_t at = (size_t)((uint8_t *)*record - buffer);
        while (next < g_count && g_offsets[next] != at) next++;
        next++;
    }
    if (next >= g_count || g_offsets[next] >= valid) return MAX_LIMIT_REACHED;
    *record = buffer + g_offsets[next];
    return SUCCESS;
}

/* ---- driven by the test ---- */

/* The layout of CUpti_CallbackData. */
struct CallbackData {
    int site;
    const char *function_name;
    const void *params;
    void *return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
};

/* Plays one API callback (site 0 = enter, 1 = exit); returns whether it was enabled. */
int fake_api(int domain, uint32_t cbid, uint32_t correlation, int site) {
    if (!g_callback || domain < 1 || domain > 2 || cbid >= 16 || !g_enabled[domain][cbid]) return 0;
    struct CallbackData d;
    memset(&d, 0, sizeof d);
    d.site = site;
    d.function_name = "fake";
    d.correlation_id = correlation;
    g_callback(g_userdata, domain, cbid, &d);
    return 1;
}

/* Hands `len` bytes of records (starting at the given offsets) to the library the way CUPTI
 * does: a buffer from its request callback, given back through its completion callback. */
int fake_deliver(const uint8_t *bytes, size_t len, const size_t *offsets, size_t count,
                 size_t dropped) {
    uint8_t *buffer = 0;
    size_t size = 0, max_records = 0;
    if (!g_requested || !g_completed || count > 64) return 0;
    g_requested(&buffer, &size, &max_records);
    if (!buffer || size < len) return 0;
    memcpy(buffer, bytes, len);
    memcpy(g_offsets, offsets, count * sizeof(size_t));
    g_count = count;
    g_dropped = dropped;
    g_completed(0, 0, buffer, size, len);
    return 1;
}

void fake_set_now(uint64_t now) { g_now = now; }
int fake_kind_enabled(int kind) { return kind >= 0 && kind < 64 ? g_kinds[kind] : 0; }
/* Flushes with CUPTI_ACTIVITY_FLAG_FLUSH_FORCED (the periodic ones pass 0). */
int fake_forced_flushes(void) { return __atomic_load_n(&g_forced_flushes, __ATOMIC_SEQ_CST); }
/* Another CUPTI client holds CUPTI. */
void fake_hold(void) { g_subscribed = 1; }
