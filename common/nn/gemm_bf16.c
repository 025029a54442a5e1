/* gemm_bf16.c — bf16 GEMMs through oneDNN's matmul primitive (see gemm_bf16.h).
 *
 * DESIGN: oneDNN 2.6's C API has no bf16 BLAS call, only primitives: a matmul is made for
 * one shape (sizes, strides, transposes and whether C is added to) and then run on any
 * pointers. Each thread keeps its own primitives with their memory objects and a stream
 * (a memory object's pointer is set per call, so none is shared between threads), looked
 * up by shape in a small table (oneDNN's own process-wide primitive cache is off); a full
 * table drops its least recently used entry, and a shape oneDNN refused is remembered, so
 * it goes to the fallback at once. oneDNN is built on
 * OpenMP here: each calling thread asks for one OpenMP thread once, so a product runs on
 * the thread that calls it. */
#include "common/nn/gemm_bf16.h"

#include "common/dtype.h"
#include "common/log.h"
#include "common/nn/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CACHE_SLOTS = 96, SCRATCH_SLOTS = 6 }; /* scratch 0-3: the callers'; 4-5: fallback's */

typedef struct shape {
    int ta, tb, M, N, K, lda, ldb, ldc, acc;
    int f32; /* A and B in fp32 (pst_gemm_onednn_f32), else bf16 */
} shape;

typedef struct entry {
    shape key;
    dnnl_primitive_t prim; /* NULL: oneDNN refused the shape (failed), computed by fallback */
    dnnl_memory_t a, b, c;
    dnnl_status_t failed;
    unsigned long used; /* the thread's clock at its last use */
} entry;

typedef struct tcache {
    dnnl_stream_t stream;
    entry e[CACHE_SLOTS];
    int n;               /* entries in use */
    unsigned long clock; /* one tick per product */
    uint16_t *scratch[SCRATCH_SLOTS];
    size_t cap[SCRATCH_SLOTS];
} tcache;

static dnnl_engine_t engine;
static atomic_int enabled;  /* pst_gemm_bf16_on() */
static atomic_int emulated; /* setup's emulation: the fp32 path of fallback */
static atomic_int warned;
static pthread_key_t cache_key;

static void entry_free(entry *e)
{
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    memset(e, 0, sizeof *e);
}

static void cache_free(void *p)
{
    tcache *t = p;
    for (int i = 0; i < t->n; i++)
        entry_free(&t->e[i]);
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        free(t->scratch[i]);
    if (t->stream)
        dnnl_stream_destroy(t->stream);
    free(t);
}

static int key_ok;

static void key_make(void)
{
    key_ok = pthread_key_create(&cache_key, cache_free) == 0;
}

static tcache *cache_get(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, key_make);
    if (!key_ok)
        return NULL;
    tcache *t = pthread_getspecific(cache_key);
    if (t)
        return t;
    if (!(t = calloc(1, sizeof *t)))
        return NULL;
    if (pthread_setspecific(cache_key, t) != 0) {
        free(t);
        return NULL;
    }
    pst_omp_single_thread(); /* this thread's products run on this thread */
    return t;
}

/* Makes the matmul for shape k into e; dnnl_success or oneDNN's error. impl (may be NULL)
 * gets oneDNN's name of the kernel it picked. */
static dnnl_status_t entry_make(entry *e, const shape *k, char *impl, size_t impl_n)
{
    const dnnl_dims_t ad = {k->M, k->K}, as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
    const dnnl_dims_t bd = {k->K, k->N}, bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
    const dnnl_dims_t cd = {k->M, k->N}, cs = {k->ldc, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const dnnl_data_type_t dt = k->f32 ? dnnl_f32 : dnnl_bf16;
    dnnl_status_t st;
    memset(e, 0, sizeof *e);
    e->key = *k;
    if ((st = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dt, as)) ||
        (st = dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dt, bs)) ||
        (st = dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs)) ||
        (st = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd)) ||
        (st = dnnl_primitive_attr_create(&attr)))
        return st;
    if (k->acc && (!(st = dnnl_post_ops_create(&po))) &&
        !(st = dnnl_post_ops_append_sum(po, 1.0f)))
        st = dnnl_primitive_attr_set_post_ops(attr, po);
    if (!st)
        st = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
    const char *name = NULL;
    if (!st && impl && !(st = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0,
                                                         (void *)&name)))
        snprintf(impl, impl_n, "%s", name ? name : "?");
    if (!st)
        st = dnnl_primitive_create(&e->prim, pd);
    if (!st && !(st = dnnl_memory_create(&e->a, &amd, engine, DNNL_MEMORY_NONE)) &&
        !(st = dnnl_memory_create(&e->b, &bmd, engine, DNNL_MEMORY_NONE)))
        st = dnnl_memory_create(&e->c, &cmd, engine, DNNL_MEMORY_NONE);
    if (po)
        dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (st)
        entry_free(e);
    return st;
}

static dnnl_status_t run(tcache *t, const shape *k, const void *A, const void *B, float *C)
{
    dnnl_status_t st;
    if (!t->stream && (st = dnnl_stream_create(&t->stream, engine, dnnl_stream_default_flags)))
        return st;
    entry *e = NULL;
    for (int i = 0; i < t->n && !e; i++)
        if (!memcmp(&t->e[i].key, k, sizeof *k))
            e = &t->e[i];
    if (!e) { /* a free entry, or the least recently used one */
        if (t->n < CACHE_SLOTS) {
            e = &t->e[t->n++];
        } else {
            e = &t->e[0];
            for (int i = 1; i < CACHE_SLOTS; i++)
                e = t->e[i].used < e->used ? &t->e[i] : e;
            entry_free(e);
        }
        char impl[96];
        const int debug = pst_log_enabled(PST_LOG_DEBUG);
        if (!(st = entry_make(e, k, debug ? impl : NULL, sizeof impl)) && debug)
            pst_log_write(PST_LOG_DEBUG, "bf16 GEMM %dx%dx%d%s%s%s: kernel %s", k->M, k->N,
                          k->K, k->ta ? " A^T" : "", k->tb ? " B^T" : "",
                          k->acc ? " +C" : "", impl);
        if (st) { /* kept, so that the shape goes straight to the fallback next time */
            e->key = *k;
            e->failed = st;
        }
    }
    e->used = ++t->clock;
    if (!e->prim)
        return e->failed;
    if ((st = dnnl_memory_set_data_handle(e->a, (void *)A)) ||
        (st = dnnl_memory_set_data_handle(e->b, (void *)B)) ||
        (st = dnnl_memory_set_data_handle(e->c, C)))
        return st;
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    if ((st = dnnl_primitive_execute(e->prim, t->stream, 3, args)))
        return st;
    return dnnl_stream_wait(t->stream);
}

/* slot of this thread's scratch, any of them (the callers' or the fallback's) */
static uint16_t *scratch(int slot, size_t n)
{
    tcache *t = cache_get();
    if (!t)
        return NULL;
    if (t->cap[slot] < n) {
        uint16_t *p = realloc(t->scratch[slot], n * sizeof *p);
        if (!p)
            return NULL;
        t->scratch[slot] = p;
        t->cap[slot] = n;
    }
    return t->scratch[slot];
}

uint16_t *pst_gemm_bf16_scratch(int slot, size_t n)
{
    return slot >= 0 && slot < 4 ? scratch(slot, n) : NULL;
}

void pst_bf16_rows(uint16_t *dst, const float *src, int rows, int n, int64_t ld)
{
    for (int r = 0; r < rows; r++)
        pst_cast(dst + (int64_t)r * n, PST_BF16, src + r * ld, PST_F32, (size_t)n);
}

/* fp32 copies of a bf16 matrix of `rows` rows of `cols` (row stride ld) */
static float *widen(int slot, const uint16_t *m, int rows, int cols, int ld)
{
    float *f = (float *)(void *)scratch(slot, 2 * (size_t)rows * (size_t)ld);
    if (f)
        pst_cast(f, PST_F32, m, PST_BF16, (size_t)(rows - 1) * (size_t)ld + (size_t)cols);
    return f;
}

/* The same products from fp32 copies of A and B through OpenBLAS: a bf16 x bf16 product is
 * exact in fp32, so only the order of the sums differs from oneDNN's. For setup's
 * emulation, or when oneDNN failed (why). */
static void fallback(const shape *k, const uint16_t *A, const uint16_t *B, float *C,
                     dnnl_status_t why)
{
    if (why != dnnl_success && !atomic_exchange(&warned, 1))
        pst_log_write(PST_LOG_WARN, "bf16 GEMM: oneDNN failed (status %d); the products "
                      "go through fp32 copies and OpenBLAS", (int)why);
    const float *a = widen(4, A, k->ta ? k->K : k->M, k->ta ? k->M : k->K, k->lda);
    const float *b = widen(5, B, k->tb ? k->N : k->K, k->tb ? k->K : k->N, k->ldb);
    if (!a || !b) {
        /* nothing left to compute with: the step's values become NaN, and the trainer
         * stops on them (a NaN gradient fails its block's exchange) */
        for (int i = 0; i < k->M; i++)
            for (int j = 0; j < k->N; j++)
                C[(int64_t)i * k->ldc + j] = __builtin_nanf("");
        return;
    }
    cblas_sgemm(CblasRowMajor, k->ta ? CblasTrans : CblasNoTrans,
                k->tb ? CblasTrans : CblasNoTrans, k->M, k->N, k->K, 1.0f, a, k->lda, b, k->ldb,
                k->acc ? 1.0f : 0.0f, C, k->ldc);
}

void pst_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                   const uint16_t *B, int ldb, int accumulate, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    const shape k = {trans_a != 0, trans_b != 0, M, N, K, lda, ldb, ldc, accumulate != 0, 0};
    if (K <= 0) {
        for (int i = 0; !k.acc && i < M; i++)
            memset(C + (int64_t)i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    if (atomic_load_explicit(&emulated, memory_order_relaxed)) {
        fallback(&k, A, B, C, dnnl_success);
        return;
    }
    tcache *t = cache_get();
    const dnnl_status_t st = t ? run(t, &k, A, B, C) : dnnl_out_of_memory;
    if (st != dnnl_success)
        fallback(&k, A, B, C, st);
}

int pst_gemm_onednn_f32(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                        const float *B, int ldb, int accumulate, float *C, int ldc)
{
    const shape k = {trans_a != 0, trans_b != 0, M, N, K, lda, ldb, ldc, accumulate != 0, 1};
    tcache *t = engine ? cache_get() : NULL;
    return t && M > 0 && N > 0 && K > 0 && run(t, &k, A, B, C) == dnnl_success ? 0 : -1;
}

int pst_gemm_bf16_on(void)
{
    return atomic_load_explicit(&enabled, memory_order_relaxed);
}

int pst_gemm_bf16_setup(int mode, char *msg, size_t n)
{
    atomic_store(&enabled, 0);
    atomic_store(&emulated, 0);
    if (mode == PST_GEMM_BF16_OFF) {
        snprintf(msg, n, "bf16 GEMMs off");
        return 0;
    }
    if (!cache_get()) {
        snprintf(msg, n, "bf16 GEMMs off: no thread-local memory");
        return 0;
    }
    const dnnl_version_t *v = dnnl_version();
    dnnl_status_t st = dnnl_success;
    if (!engine) { /* also when emulated: pst_gemm_onednn_f32 runs on it */
        /* Each thread's table holds its primitives: oneDNN's own process-wide cache would
         * keep a second copy of each and share its entries between the threads, through
         * atomics its uninstrumented build hides from ThreadSanitizer (3 of 10 TSan runs
         * of exec::bf16_gemms_learn_and_schedules_agree reported races inside it, none of
         * 12 without it). */
        st = dnnl_set_primitive_cache_capacity(0);
        if (!st)
            st = dnnl_engine_create(&engine, dnnl_cpu, 0);
    }
    if (mode == PST_GEMM_BF16_EMULATE) {
        snprintf(msg, n, "bf16 GEMMs on, emulated: bf16-rounded operands go through OpenBLAS "
                 "in fp32 (the same products, summed in another order; slower than fp32)");
        atomic_store(&emulated, 1);
        atomic_store(&enabled, 1);
        return 1;
    }
    /* a probe the shape of a small layer, for the kernel oneDNN picks */
    const shape k = {0, 1, 64, 64, 64, 64, 64, 64, 0, 0};
    entry e;
    char impl[96];
    if (st || (st = entry_make(&e, &k, impl, sizeof impl))) {
        snprintf(msg, n, "bf16 GEMMs off: oneDNN %d.%d.%d has no bf16 matmul for this CPU "
                 "(status %d)", v->major, v->minor, v->patch, (int)st);
        return 0;
    }
    entry_free(&e);
    snprintf(msg, n, "bf16 GEMMs on: oneDNN %d.%d.%d matmul, kernel %s", v->major, v->minor,
             v->patch, impl);
    atomic_store(&enabled, 1);
    return 1;
}
