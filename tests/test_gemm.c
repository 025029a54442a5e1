/* test_gemm.c — the CPU layers' fp32 GEMM (common/nn/gemm.h) with each library: products
 * against a float64 reference for every transpose, alpha, beta and stride, nothing written
 * outside C's block, the same bits on every call and from every thread, and each calling
 * thread held to one OpenMP thread (oneDNN would otherwise start a team per call). */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/nn/gemm.h"
#include "common/rng.h"

static const int libs[] = {PST_SGEMM_OPENBLAS, PST_SGEMM_ONEDNN};

static void use(int lib)
{
    char msg[200];
    cr_assert_eq(pst_sgemm_setup(lib, msg, sizeof msg), lib, "%s", msg);
    cr_assert_eq(pst_sgemm_lib(), lib);
    cr_assert(strstr(msg, lib == PST_SGEMM_ONEDNN ? "oneDNN" : "OpenBLAS"), "%s", msg);
}

static float *filled(size_t n, uint64_t seed)
{
    float *p = malloc(n * sizeof *p);
    cr_assert_not_null(p);
    pst_rng r;
    pst_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)pst_rng_uniform(&r) - 0.5f;
    return p;
}

/* element (i, k) of op(A), A stored with row stride ld */
static double at(const float *a, int trans, int ld, int i, int k)
{
    return trans ? a[(size_t)k * ld + i] : a[(size_t)i * ld + k];
}

Test(gemm, products_match_float64_with_each_library)
{
    const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 48, 33}, {128, 96, 784}, {33, 130, 1024}};
    for (size_t l = 0; l < 2; l++) {
        use(libs[l]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 8; t++) {
                const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                const int ta = t & 1, tb = t >> 1 & 1, accumulate = t >> 2 & 1;
                const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
                const float alpha = accumulate ? 0.5f : 1.0f, beta = accumulate ? 1.0f : 0.0f;
                float *a = filled((size_t)lda * (ta ? K : M), 1 + t);
                float *b = filled((size_t)ldb * (tb ? N : K), 2 + t);
                float *c = filled((size_t)ldc * M, 3 + t);
                float *c0 = malloc((size_t)ldc * M * sizeof *c0);
                memcpy(c0, c, (size_t)ldc * M * sizeof *c0);
                pst_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        const size_t at_c = (size_t)i * ldc + j;
                        if (j >= N) { /* beside the block: untouched */
                            cr_assert_eq(c[at_c], c0[at_c], "lib %d wrote column %d of %d",
                                         libs[l], j, N);
                            continue;
                        }
                        double want = beta * c0[at_c], mag = fabs(want);
                        for (int k = 0; k < K; k++) {
                            const double p = at(a, ta, lda, i, k) * at(b, !tb, ldb, j, k);
                            want += alpha * p;
                            mag += fabs(alpha * p);
                        }
                        cr_assert(fabs(c[at_c] - want) <= 1e-6 * mag + 1e-30,
                                  "lib %d %dx%dx%d ta %d tb %d beta %g: C[%d][%d] %.9g, want "
                                  "%.9g",
                                  libs[l], M, N, K, ta, tb, beta, i, j, c[at_c], want);
                    }
                free(a);
                free(b);
                free(c);
                free(c0);
            }
    }
}

typedef struct job {
    const float *a, *b;
    float *c;
    int M, N, K, omp_after;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    pst_sgemm(0, 1, j->M, j->N, j->K, 1.0f, j->a, j->K, j->b, j->K, 0.0f, j->c, j->N);
    j->omp_after = omp_get_max_threads();
    return NULL;
}

/* The bits of the parameters rest on a product's bits depending on its call alone. */
Test(gemm, the_same_bits_on_every_call_and_thread_with_one_openmp_thread_each)
{
    enum { M = 256, N = 384, K = 1024 };
    float *a = filled((size_t)M * K, 11), *b = filled((size_t)N * K, 12);
    for (size_t l = 0; l < 2; l++) {
        use(libs[l]);
        float *first = malloc(sizeof(float) * M * N);
        job jobs[3];
        pthread_t th[3];
        for (int i = 0; i < 3; i++)
            jobs[i] = (job){a, b, malloc(sizeof(float) * M * N), M, N, K, 0};
        run_job(&jobs[0]);
        memcpy(first, jobs[0].c, sizeof(float) * M * N);
        for (int i = 0; i < 3; i++) /* three threads at once, each new to OpenMP */
            cr_assert_eq(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
        for (int i = 0; i < 3; i++) {
            pthread_join(th[i], NULL);
            cr_assert_eq(memcmp(first, jobs[i].c, sizeof(float) * M * N), 0,
                         "lib %d: thread %d got other bits", libs[l], i);
            if (libs[l] == PST_SGEMM_ONEDNN)
                cr_assert_eq(jobs[i].omp_after, 1, "a thread kept %d OpenMP threads",
                             jobs[i].omp_after);
            free(jobs[i].c);
        }
        free(first);
    }
    free(a);
    free(b);
}

Test(gemm, openblas_until_set_up)
{
    cr_assert_eq(pst_sgemm_lib(), PST_SGEMM_OPENBLAS);
    char msg[200];
    use(PST_SGEMM_ONEDNN);
    cr_assert_eq(pst_sgemm_setup(PST_SGEMM_OPENBLAS, msg, sizeof msg), PST_SGEMM_OPENBLAS);
    cr_assert_eq(pst_sgemm_lib(), PST_SGEMM_OPENBLAS);
    cr_assert_str_eq(msg, "fp32 GEMMs: OpenBLAS");
}
