/* test_step_alloc.c — a training step allocates nothing: every buffer the executor, the
 * layers, the streams and the in-process store use is allocated before step 0 (DESIGN.md).
 * The test binary interposes malloc, calloc, realloc and posix_memalign with counters that
 * are on only while steps run (any thread: stream workers, thread teams, the store), warms
 * up for two steps, then counts over five: zero calls, for the MLP on Fashion-MNIST and the
 * GPT on the King James Bible, on one and on two CPU devices. OpenBLAS runs single-threaded
 * as in the trainer (main.c): its own threading allocates per call. */
#include <cblas.h>
#include <criterion/criterion.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/data/data.h"
#include "common/data/text.h"
#include "common/nn/models/models.h"
#include "common/runtime/device.h"
#include "trainer/exec.h"
#include "trainer/local.h"
#include "trainer/plan.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_int counting;
static atomic_long calls;

void *malloc(size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&calls, 1);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t k)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&calls, 1);
    return __libc_calloc(n, k);
}

void *realloc(void *p, size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&calls, 1);
    return __libc_realloc(p, n);
}

int posix_memalign(void **p, size_t align, size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&calls, 1);
    *p = __libc_memalign(align, n);
    return *p ? 0 : 12 /* ENOMEM */;
}

void *aligned_alloc(size_t align, size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&calls, 1);
    return __libc_memalign(align, n);
}

/* Runs 2 + 5 steps of `model` (built from cfg) on `devices` through the in-process store
 * with batches from next(step, x, y); returns the allocations counted in the last five. */
typedef void (*batch_fn)(void *ctx, long step, int rows, void *x, int32_t *y);

static long count_step_allocations(pst_config *cfg, const pst_model *model, const char *devices,
                                   int rows, batch_fn next, void *ctx)
{
    openblas_set_num_threads(1);
    pst_runtime *rt = NULL;
    cr_assert_eq(pst_runtime_init(&rt, devices), PST_OK, "%s", pst_error_detail());
    tr_plan plan;
    const tr_exec_settings es = tr_exec_settings_of(cfg);
    cr_assert_eq(tr_exec_plan(&plan, model, &es, cfg->block_bytes, 1, pst_runtime_count(rt)),
                 PST_OK, "%s", pst_error_detail()); /* a pipeline's cut at its stages */
    tr_link *link;
    const tr_link_settings ls = tr_link_settings_of(cfg, &plan);
    cr_assert_eq(tr_local_init(&link, &ls, &plan), PST_OK, "%s", pst_error_detail());
    tr_exec_config ec = {.cfg = es,
                         .rt = rt, .model = model, .max_rows = rows,
                         .eval_rows = rows, .link = link, .overlap = 1, .threads = 2};
    tr_exec *ex = NULL;
    cr_assert_eq(tr_exec_init(&ex, &ec), PST_OK, "%s", pst_error_detail());
    cr_assert_eq(tr_exec_start(ex, 1), PST_OK, "%s", pst_error_detail());
    const size_t row_in = (size_t)(model->in_width > 0 ? model->in_width : 1);
    const size_t row_t = (size_t)model->target_width;
    void *x = malloc(sizeof(float) * rows * row_in);
    int32_t *y = malloc(sizeof(int32_t) * rows * row_t);
    long counted = 0;
    for (long s = 0; s < 7; s++) {
        next(ctx, s, rows, x, y);
        double loss;
        if (s == 2) {
            atomic_store(&calls, 0);
            atomic_store(&counting, 1);
        }
        cr_assert_eq(tr_exec_step(ex, s, x, y, rows, rows, &loss), PST_OK, "%s",
                     pst_error_detail());
        if (s == 6) {
            cr_assert_eq(tr_exec_sync(ex), PST_OK, "%s", pst_error_detail());
            atomic_store(&counting, 0);
            counted = atomic_load(&calls);
        }
    }
    tr_exec_free(ex);
    tr_link_free(link);
    tr_plan_free(&plan);
    pst_runtime_free(rt);
    free(x);
    free(y);
    return counted;
}

static void text_batch(void *ctx, long step, int rows, void *x, int32_t *y)
{
    const pst_text *t = ctx;
    pst_text_train_rows(t, 16, 1, step, rows, 0, rows, x, y);
}

typedef struct images {
    pst_dataset train, test;
    uint32_t idx[64];
} images;

static void image_batch(void *ctx, long step, int rows, void *x, int32_t *y)
{
    images *im = ctx;
    for (int i = 0; i < rows; i++)
        im->idx[i] = (uint32_t)(step * rows + i);
    pst_dataset_gather(&im->train, im->idx, rows, x, y);
}

static void base_config(pst_config *cfg)
{
    pst_config_defaults(cfg);
    cfg->block_bytes = 16384;
    cfg->optim.kind = PST_OPTIM_ADAMW;
    cfg->optim.lr = 1e-3f;
}

Test(step_alloc, gpt_steps_allocate_nothing, .timeout = 60)
{
    pst_text t;
    cr_assert_eq(pst_text_load(&t, PST_KJV_PATH, 16), PST_OK, "%s", pst_error_detail());
    pst_model m;
    cr_assert_eq(pst_model_gpt(&m, t.vocab, 16, 2, 2, 32), PST_OK);
    pst_config cfg;
    base_config(&cfg);
    const char *devs[] = {"cpu:1", "cpu:2"};
    for (int i = 0; i < 2; i++) {
        long n = count_step_allocations(&cfg, &m, devs[i], 8, text_batch, &t);
        cr_assert_eq(n, 0, "gpt on %s: %ld allocations in five steps", devs[i], n);
    }
    /* a pipeline: 2 stages, 4 micro-batches, each schedule */
    cfg.pipeline = 2;
    cfg.micro_batches = 4;
    const pst_schedule kinds[] = {PST_SCHEDULE_1F1B, PST_SCHEDULE_GPIPE,
                                  PST_SCHEDULE_INTERLEAVED};
    for (int i = 0; i < 3; i++) {
        cfg.schedule = kinds[i];
        cfg.virtual_stages = kinds[i] == PST_SCHEDULE_INTERLEAVED ? 2 : 1;
        long n = count_step_allocations(&cfg, &m, "cpu:2", 8, text_batch, &t);
        cr_assert_eq(n, 0, "gpt pipeline %s: %ld allocations in five steps",
                     pst_schedule_name(kinds[i]), n);
    }
    /* two replicas of it (cpu:4), and the pipeline in bf16 and fp16 */
    cfg.schedule = PST_SCHEDULE_1F1B;
    cfg.virtual_stages = 1;
    long n = count_step_allocations(&cfg, &m, "cpu:4", 8, text_batch, &t);
    cr_assert_eq(n, 0, "gpt pipeline x 2 replicas: %ld allocations in five steps", n);
    const pst_dtype dts[] = {PST_BF16, PST_F16};
    for (int i = 0; i < 2; i++) {
        cfg.precision = dts[i];
        n = count_step_allocations(&cfg, &m, "cpu:2", 8, text_batch, &t);
        cr_assert_eq(n, 0, "gpt pipeline in %s: %ld allocations in five steps",
                     pst_dtype_name(dts[i]), n);
    }
    pst_model_free(&m);
    pst_text_free(&t);
}

Test(step_alloc, mlp_steps_allocate_nothing, .timeout = 60)
{
    images im = {0};
    cr_assert_eq(pst_dataset_load(&im.train, &im.test, "fashion-mnist",
                                  "/usr/share/datasets/fashion-mnist"), PST_OK, "%s",
                 pst_error_detail());
    pst_model m;
    const int hidden[2] = {64, 32};
    cr_assert_eq(pst_model_mlp(&m, im.train.dim, 10, 2, hidden), PST_OK);
    pst_config cfg;
    base_config(&cfg);
    const char *devs[] = {"cpu:1", "cpu:2"};
    for (int i = 0; i < 2; i++) {
        long n = count_step_allocations(&cfg, &m, devs[i], 64, image_batch, &im);
        cr_assert_eq(n, 0, "mlp on %s: %ld allocations in five steps", devs[i], n);
    }
    pst_model_free(&m);
    pst_dataset_free(&im.train);
    pst_dataset_free(&im.test);
}
