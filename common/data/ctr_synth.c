/* ctr_synth.c — the planted-truth click-data generator (see ctr_synth.h for the process,
 * the design and what is deterministic). */
#include "common/data/ctr_synth.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/data/ctr.h"
#include "common/memory.h"
#include "common/rng.h"

#define MAX_RANK 1024
#define MAX_THREADS 256
#define MAX_ROWS ((uint64_t)1 << 40) /* the reader's bound (ctr.c) */
#define CHUNK_BYTES (1 << 20)        /* about what a thread encodes per write */
#define HOT_RANKS 4096               /* ranks whose id and weights are kept (most draws) */

/* The pst_rng stream of each kind of draw: the kind in the top 4 bits, a field in the 10
 * bits above bit 40, a row or an id (< 2^40) below. */
enum { DRAW_ROW = 1, DRAW_LABEL, DRAW_ID, DRAW_PERM, DRAW_PAIRS, DRAW_DENSE_WEIGHTS };

static void seed_stream(pst_rng *r, uint64_t seed, int kind, int field, uint64_t index)
{
    pst_rng_seed(r, seed, (uint64_t)kind << 60 | (uint64_t)field << 40 | index);
}

/* Uniform in [0, 1) with 53 random bits. */
static double uniform53(pst_rng *r)
{
    return (double)(pst_rng_u64(r) >> 11) * 0x1p-53;
}

/* Two independent N(0, 1) by Marsaglia's polar method (sqrt and log; no sin or cos). */
static void normal_pair(pst_rng *r, double out[2])
{
    double a, b, q;
    do {
        a = 2.0 * uniform53(r) - 1.0;
        b = 2.0 * uniform53(r) - 1.0;
        q = a * a + b * b;
    } while (q >= 1.0 || q == 0.0);
    const double m = sqrt(-2.0 * log(q) / q);
    out[0] = a * m;
    out[1] = b * m;
}

/* ---- Zipf ranks by rejection-inversion (Hormann & Derflinger 1996) ----
 * h(x) = x^-e is the unnormalized mass; H is an antiderivative of h (log x at e = 1) and
 * Hinv its inverse. A uniform u on (H(1.5) - 1, H(n + 0.5)] is inverted to x and rounded to
 * the rank k; k is taken when x falls in the part of k's cell whose area equals h(k)
 * exactly (the squeeze `k - x <= sq` first), else drawn again: P(k) = h(k) / sum h. */
typedef struct zipf {
    double e, one_minus_e;
    double h_x1;  /* H(1.5) - 1 */
    double h_n;   /* H(n + 0.5) */
    double sq;    /* 2 - Hinv(H(2.5) - h(2)) */
    uint64_t n;
} zipf;

/* log1p(x) / x and expm1(x) / x, by their series near 0 */
static double log1p_over(double x)
{
    return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

static double expm1_over(double x)
{
    return fabs(x) > 1e-8 ? expm1(x) / x
                          : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

static double zipf_h(const zipf *z, double x)
{
    return exp(-z->e * log(x));
}

static double zipf_big_h(const zipf *z, double x)
{
    const double lx = log(x);
    return expm1_over(z->one_minus_e * lx) * lx;
}

static double zipf_big_h_inv(const zipf *z, double x)
{
    double t = x * z->one_minus_e;
    if (t < -1.0)
        t = -1.0; /* rounding past the pole */
    return exp(log1p_over(t) * x);
}

static void zipf_init(zipf *z, uint64_t n, double e)
{
    z->e = e;
    z->one_minus_e = 1.0 - e;
    z->n = n;
    z->h_x1 = zipf_big_h(z, 1.5) - 1.0;
    z->h_n = zipf_big_h(z, (double)n + 0.5);
    z->sq = 2.0 - zipf_big_h_inv(z, zipf_big_h(z, 2.5) - zipf_h(z, 2.0));
}

/* A rank in [1, n]. */
static uint64_t zipf_draw(const zipf *z, pst_rng *r)
{
    for (;;) {
        const double u = z->h_n + uniform53(r) * (z->h_x1 - z->h_n);
        const double x = zipf_big_h_inv(z, u);
        double kd = floor(x + 0.5);
        kd = kd < 1.0 ? 1.0 : kd > (double)z->n ? (double)z->n : kd; /* rounding at the ends */
        if (kd - x <= z->sq || u >= zipf_big_h(z, kd + 0.5) - zipf_h(z, kd))
            return (uint64_t)kd;
    }
}

/* ---- a random permutation of [0, n) without a table ----
 * A balanced Feistel network on 2 x half bits (a bijection of [0, 4^half), 4^half < 4n)
 * whose rounds mix the right half with a round key; values at or past n walk on through
 * the network until they land below n, which keeps it a bijection of [0, n). */
typedef struct feistel {
    uint64_t n, mask, key[4];
    int half;
} feistel;

static void feistel_init(feistel *p, uint64_t n, uint64_t seed, int field)
{
    int bits = 0;
    while (bits < 64 && ((uint64_t)1 << bits) < n)
        bits++;
    p->n = n;
    p->half = bits < 2 ? 1 : (bits + 1) / 2;
    p->mask = ((uint64_t)1 << p->half) - 1;
    pst_rng r;
    seed_stream(&r, seed, DRAW_PERM, field, 0);
    for (int i = 0; i < 4; i++)
        p->key[i] = pst_rng_u64(&r);
}

static uint64_t feistel_apply(const feistel *p, uint64_t x)
{
    do {
        uint64_t l = x >> p->half, r = x & p->mask;
        for (int i = 0; i < 4; i++) {
            const uint64_t t = l ^ (pst_rng_mix(r ^ p->key[i]) & p->mask);
            l = r;
            r = t;
        }
        x = l << p->half | r;
    } while (x >= p->n);
    return x;
}

/* ---- the generator ---- */
typedef struct field {
    uint32_t vocab;     /* V_f */
    zipf rank;
    feistel perm;
    int paired;         /* in one of the pairs: its ids' vectors are needed */
    uint32_t hot;       /* min(V_f, HOT_RANKS): ranks 1..hot are kept below */
    uint32_t *hot_id;   /* (hot) the id of rank r + 1 */
    double *hot_w;      /* (hot, 1 + k) its s and v: the same numbers id_weights draws */
    uint64_t *bitmap;   /* (V_f / 64 rounded up) ids of the training rows, or NULL */
    uint32_t *list;     /* (train_rows) or, when smaller than the bitmap, their ids */
} field;

typedef struct synth {
    const pst_ctr_synth_config *cfg;
    int F, D, k;
    field *fields;         /* (F) */
    int npairs;
    uint16_t (*pairs)[2];  /* (npairs, 2) f < g, in order */
    double *w;             /* (D) dense weights */
    uint64_t rows, train_rows, test_rows;
    double *logit;         /* (rows) logit - b in pass 1, p_true after the bisection */
    uint8_t *label;        /* (rows) */
    size_t record;         /* bytes of a row in the file */
} synth;

/* One thread's rows [first, first + count) and its scratch. */
typedef struct job {
    const synth *g;
    uint64_t first, count;
    unsigned char *out;  /* pass 2: (count, record) bytes; pass 1: NULL */
    uint32_t *ids;       /* (F) */
    uint64_t *ranks;     /* (F) */
    float *x;            /* (D) */
    double *vec;         /* (F, k) scratch of the vectors drawn */
    const double **v;    /* (F) the row's vectors (kept or in vec) */
} job;

/* Row r's Zipf ranks - 1 (F), ids (F) and dense features (D), from the row's own stream. */
static void draw_row(const synth *g, uint64_t r, uint64_t *ranks, uint32_t *ids, float *x)
{
    pst_rng rng;
    seed_stream(&rng, g->cfg->seed, DRAW_ROW, 0, r);
    for (int f = 0; f < g->F; f++) {
        const field *fd = &g->fields[f];
        ranks[f] = zipf_draw(&fd->rank, &rng) - 1;
        ids[f] = ranks[f] < fd->hot ? fd->hot_id[ranks[f]]
                                    : (uint32_t)feistel_apply(&fd->perm, ranks[f]);
    }
    double n[2];
    for (int j = 0; j < g->D; j++) {
        if (j % 2 == 0)
            normal_pair(&rng, n);
        x[j] = (float)n[j % 2];
    }
}

/* s[f,id], and v[f,id] (k) into v when not NULL, from the id's own stream. */
static double id_weights(uint64_t seed, int k, int f, uint32_t id, double *v)
{
    pst_rng rng;
    seed_stream(&rng, seed, DRAW_ID, f, id);
    double n[2];
    normal_pair(&rng, n);
    const double s = 0.2 * n[0];
    for (int j = 0; v && j < k; j++) { /* normals 1..k of the stream */
        if ((j + 1) % 2 == 0)
            normal_pair(&rng, n);
        v[j] = 0.25 * n[(j + 1) % 2];
    }
    return s;
}

/* s of field f's id (of rank - 1 `rank`); *v points at its v: kept, or drawn into
 * scratch (k) when scratch is not NULL. */
static double rank_weights(const synth *g, int f, uint64_t rank, uint32_t id, double *scratch,
                           const double **v)
{
    const field *fd = &g->fields[f];
    if (rank >= fd->hot) {
        *v = scratch;
        return id_weights(g->cfg->seed, g->k, f, id, scratch);
    }
    const double *w = fd->hot_w + rank * (uint64_t)(1 + g->k);
    *v = w + 1;
    return w[0];
}

static void mark_seen(const synth *g, uint64_t r, const uint32_t *ids)
{
    for (int f = 0; f < g->F; f++) {
        field *fd = &g->fields[f];
        if (fd->list) {
            fd->list[r] = ids[f]; /* each row its own slot */
            continue;
        }
        uint64_t *word = &fd->bitmap[ids[f] / 64];
        const uint64_t bit = (uint64_t)1 << (ids[f] % 64);
        if (!(__atomic_load_n(word, __ATOMIC_RELAXED) & bit)) /* hot ids: no write */
            __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
    }
}

/* Pass 1: each row's logit without the bias; the training rows' ids marked seen. */
static void *pass_logits(void *arg)
{
    const job *j = arg;
    const synth *g = j->g;
    const int k = g->k;
    for (uint64_t r = j->first; r < j->first + j->count; r++) {
        draw_row(g, r, j->ranks, j->ids, j->x);
        if (r < g->train_rows)
            mark_seen(g, r, j->ids);
        double z = 0.0;
        for (int f = 0; f < g->F; f++)
            z += rank_weights(g, f, j->ranks[f], j->ids[f],
                              g->fields[f].paired ? j->vec + (size_t)f * k : NULL, &j->v[f]);
        for (int p = 0; p < g->npairs; p++) {
            const double *a = j->v[g->pairs[p][0]], *b = j->v[g->pairs[p][1]];
            double dot = 0.0;
            for (int i = 0; i < k; i++)
                dot += a[i] * b[i];
            z += dot;
        }
        for (int i = 0; i < g->D; i++)
            z += (double)j->x[i] * g->w[i];
        g->logit[r] = z;
    }
    return NULL;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static void putf(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put32(p, u);
}

/* Pass 2: the rows drawn again and encoded: label, 3 zero bytes, p_true, dense, ids. */
static void *pass_encode(void *arg)
{
    const job *j = arg;
    const synth *g = j->g;
    for (uint64_t i = 0; i < j->count; i++) {
        const uint64_t r = j->first + i;
        unsigned char *o = j->out + i * g->record;
        draw_row(g, r, j->ranks, j->ids, j->x);
        put32(o, g->label[r]);
        putf(o + 4, (float)g->logit[r]);
        for (int d = 0; d < g->D; d++)
            putf(o + 8 + 4 * (size_t)d, j->x[d]);
        for (int f = 0; f < g->F; f++)
            put32(o + 8 + 4 * (size_t)g->D + 4 * (size_t)f, j->ids[f]);
    }
    return NULL;
}

/* Runs fn on jobs[0..n) on n threads (this one included); a thread that cannot be started
 * leaves its job to this one (the results do not depend on who ran what). */
static void run_jobs(job *jobs, int n, void *(*fn)(void *))
{
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&tid[i], NULL, fn, &jobs[i]) == 0;
    fn(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            fn(&jobs[i]);
    }
}

/* Splits rows [first, first + count) over the n jobs. */
static void split(job *jobs, int n, uint64_t first, uint64_t count)
{
    for (int i = 0; i < n; i++) {
        jobs[i].first = first + count * (uint64_t)i / (uint64_t)n;
        jobs[i].count = first + count * (uint64_t)(i + 1) / (uint64_t)n - jobs[i].first;
    }
}

void pst_ctr_synth_defaults(pst_ctr_synth_config *cfg)
{
    *cfg = (pst_ctr_synth_config){
        .rows = 2000000, .test_frac = 0.1, .fields = 26, .dense = 13, .rank = 4, .pairs = 40,
        .min_vocab = 10, .max_vocab = 1000000, .zipf = 1.1, .ctr = 0.25, .seed = 1,
        .threads = 0,
    };
}

static uint64_t test_rows_of(const pst_ctr_synth_config *cfg)
{
    /* nearbyint rounds half to even, as Python's round */
    return (uint64_t)nearbyint((double)cfg->rows * cfg->test_frac);
}

pst_status pst_ctr_synth_check(const pst_ctr_synth_config *cfg)
{
    if (cfg->rows < 2 || cfg->rows > MAX_ROWS)
        return pst_error_set(PST_ERR_INVALID, "--rows %llu: want 2 to 2^40 (training and test "
                             "rows together)", (unsigned long long)cfg->rows);
    if (!(cfg->test_frac > 0.0 && cfg->test_frac < 1.0))
        return pst_error_set(PST_ERR_INVALID, "--test-frac %g: want a fraction in (0, 1), e.g. "
                             "0.1 (the last 10%% of the rows are the test part)", cfg->test_frac);
    const uint64_t test = test_rows_of(cfg);
    if (test < 1 || test >= cfg->rows)
        return pst_error_set(PST_ERR_INVALID, "--test-frac %g of --rows %llu leaves %llu test "
                             "rows: want at least one test and one training row",
                             cfg->test_frac, (unsigned long long)cfg->rows,
                             (unsigned long long)test);
    if (cfg->fields < 1 || cfg->fields > PST_CTR_MAX_FIELDS)
        return pst_error_set(PST_ERR_INVALID, "--fields %d: want 1 to %d", cfg->fields,
                             PST_CTR_MAX_FIELDS);
    if (cfg->dense < 0 || cfg->dense > PST_CTR_MAX_DENSE)
        return pst_error_set(PST_ERR_INVALID, "--dense %d: want 0 to %d", cfg->dense,
                             PST_CTR_MAX_DENSE);
    if (cfg->rank < 0 || cfg->rank > MAX_RANK)
        return pst_error_set(PST_ERR_INVALID, "--rank %d: want 0 to %d", cfg->rank, MAX_RANK);
    if (cfg->pairs < 0)
        return pst_error_set(PST_ERR_INVALID, "--pairs %d: want 0 or more (at most F (F - 1) "
                             "/ 2 are used)", cfg->pairs);
    if (cfg->min_vocab < 1 || cfg->max_vocab > UINT32_MAX || cfg->min_vocab > cfg->max_vocab)
        return pst_error_set(PST_ERR_INVALID, "--min-vocab %llu --max-vocab %llu: want 1 <= "
                             "min <= max <= %u (ids are u32)",
                             (unsigned long long)cfg->min_vocab,
                             (unsigned long long)cfg->max_vocab, UINT32_MAX);
    if (!(cfg->zipf >= 0.0 && cfg->zipf <= 100.0))
        return pst_error_set(PST_ERR_INVALID, "--zipf %g: want an exponent from 0 (uniform) to "
                             "100, e.g. 1.1", cfg->zipf);
    if (!(cfg->ctr > 0.0 && cfg->ctr < 1.0))
        return pst_error_set(PST_ERR_INVALID, "--ctr %g: want a click rate in (0, 1), e.g. 0.25",
                             cfg->ctr);
    if (cfg->threads < 0 || cfg->threads > MAX_THREADS)
        return pst_error_set(PST_ERR_INVALID, "--threads %d: want 0 (one per CPU) to %d",
                             cfg->threads, MAX_THREADS);
    return PST_OK;
}

/* numpy's geomspace(min, max, F) truncated: the ends exact, 10^(a + f (b - a) / (F - 1))
 * between, a = log10 min, b = log10 max (the same two roundings as its linspace). */
static uint32_t vocab_of(const pst_ctr_synth_config *cfg, int f)
{
    if (f == 0)
        return (uint32_t)cfg->min_vocab;
    if (f == cfg->fields - 1)
        return (uint32_t)cfg->max_vocab;
    const double a = log10((double)cfg->min_vocab), b = log10((double)cfg->max_vocab);
    const double step = (b - a) / (double)(cfg->fields - 1);
    return (uint32_t)pow(10.0, (double)f * step + a);
}

static int by_pair(const void *x, const void *y)
{
    const uint16_t *a = x, *b = y;
    return a[0] != b[0] ? (a[0] > b[0]) - (a[0] < b[0]) : (a[1] > b[1]) - (a[1] < b[1]);
}

static int by_id(const void *x, const void *y)
{
    const uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

static void synth_free(synth *g)
{
    for (int f = 0; g->fields && f < g->F; f++) {
        PST_FREE_ALL(g->fields[f].bitmap, g->fields[f].list, g->fields[f].hot_id,
                     g->fields[f].hot_w);
    }
    PST_FREE_ALL(g->fields, g->pairs, g->w, g->logit, g->label);
}

/* The fields (vocabularies, samplers, permutations, seen sets), the pairs and w. */
static pst_status synth_init(synth *g, const pst_ctr_synth_config *cfg)
{
    memset(g, 0, sizeof *g);
    g->cfg = cfg;
    g->F = cfg->fields;
    g->D = cfg->dense;
    g->k = cfg->rank;
    g->rows = cfg->rows;
    g->test_rows = test_rows_of(cfg);
    g->train_rows = g->rows - g->test_rows;
    g->record = 8 + 4 * (size_t)g->D + 4 * (size_t)g->F;
    const uint64_t all_pairs = (uint64_t)g->F * (uint64_t)(g->F - 1) / 2;
    g->npairs = (uint64_t)cfg->pairs < all_pairs ? cfg->pairs : (int)all_pairs;
    g->fields = calloc((size_t)g->F, sizeof *g->fields);
    g->pairs = malloc(sizeof *g->pairs * (all_pairs ? all_pairs : 1));
    g->w = malloc(sizeof *g->w * (size_t)(g->D ? g->D : 1));
    g->logit = malloc(sizeof *g->logit * g->rows);
    g->label = malloc(g->rows);
    if (!g->fields || !g->pairs || !g->w || !g->logit || !g->label)
        return pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for %llu rows "
                             "(9 bytes a row)", (unsigned long long)g->rows);
    for (int f = 0; f < g->F; f++) {
        field *fd = &g->fields[f];
        fd->vocab = vocab_of(cfg, f);
        zipf_init(&fd->rank, fd->vocab, cfg->zipf);
        feistel_init(&fd->perm, fd->vocab, cfg->seed, f);
        fd->hot = fd->vocab < HOT_RANKS ? fd->vocab : HOT_RANKS;
        fd->hot_id = malloc(sizeof *fd->hot_id * fd->hot);
        fd->hot_w = malloc(sizeof *fd->hot_w * fd->hot * (size_t)(1 + g->k));
        if (!fd->hot_id || !fd->hot_w)
            return pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for field %d", f);
        for (uint32_t r = 0; r < fd->hot; r++) {
            double *w = fd->hot_w + (size_t)r * (size_t)(1 + g->k);
            fd->hot_id[r] = (uint32_t)feistel_apply(&fd->perm, r);
            w[0] = id_weights(cfg->seed, g->k, f, fd->hot_id[r], w + 1);
        }
        const uint64_t bitmap_words = ((uint64_t)fd->vocab + 63) / 64;
        if (bitmap_words * 8 <= g->train_rows * 4)
            fd->bitmap = calloc(bitmap_words, 8);
        else
            fd->list = malloc(sizeof *fd->list * g->train_rows);
        if (!fd->bitmap && !fd->list)
            return pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for the distinct ids "
                                 "of field %d (vocabulary %u)", f, fd->vocab);
    }
    /* The pairs: a uniform choice of npairs of the F (F - 1) / 2 (partial Fisher-Yates),
     * in order. */
    uint64_t m = 0;
    for (int f = 0; f < g->F; f++)
        for (int h = f + 1; h < g->F; h++, m++) {
            g->pairs[m][0] = (uint16_t)f;
            g->pairs[m][1] = (uint16_t)h;
        }
    pst_rng r;
    seed_stream(&r, cfg->seed, DRAW_PAIRS, 0, 0);
    for (int p = 0; p < g->npairs; p++) {
        const uint64_t q = (uint64_t)p + pst_rng_below(&r, all_pairs - (uint64_t)p);
        uint16_t t[2] = {g->pairs[q][0], g->pairs[q][1]};
        memcpy(g->pairs[q], g->pairs[p], sizeof t);
        memcpy(g->pairs[p], t, sizeof t);
    }
    qsort(g->pairs, (size_t)g->npairs, sizeof *g->pairs, by_pair);
    for (int p = 0; p < g->npairs; p++)
        g->fields[g->pairs[p][0]].paired = g->fields[g->pairs[p][1]].paired = 1;
    seed_stream(&r, cfg->seed, DRAW_DENSE_WEIGHTS, 0, 0);
    double n[2];
    for (int j = 0; j < g->D; j++) {
        if (j % 2 == 0)
            normal_pair(&r, n);
        g->w[j] = 0.15 * n[j % 2];
    }
    return PST_OK;
}

/* b such that the mean of sigmoid(logit + b) is about ctr: 60 bisections on [-20, 20]. */
static double bias_for(const double *logit, uint64_t n, double ctr)
{
    double lo = -20.0, hi = 20.0;
    for (int it = 0; it < 60; it++) {
        const double mid = (lo + hi) / 2.0;
        double sum = 0.0;
        for (uint64_t i = 0; i < n; i++)
            sum += 1.0 / (1.0 + exp(-(logit[i] + mid)));
        if (sum / (double)n < ctr)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2.0;
}

/* The bias, p_true and the labels; the click rate and the test part's AUC and log loss. */
static pst_status label_rows(synth *g, pst_ctr_synth_stats *st)
{
    const double b = bias_for(g->logit, g->rows, g->cfg->ctr);
    uint64_t clicks = 0;
    for (uint64_t r = 0; r < g->rows; r++) {
        const double p = 1.0 / (1.0 + exp(-(g->logit[r] + b)));
        pst_rng rng;
        seed_stream(&rng, g->cfg->seed, DRAW_LABEL, 0, r);
        g->label[r] = uniform53(&rng) < p;
        g->logit[r] = p;
        clicks += g->label[r];
    }
    st->ctr = (double)clicks / (double)g->rows;
    const size_t nt = (size_t)g->test_rows;
    float *p = malloc(sizeof *p * nt), *y = malloc(sizeof *y * nt);
    uint64_t *scratch = malloc(sizeof *scratch * nt);
    if (!p || !y || !scratch) {
        PST_FREE_ALL(p, y, scratch);
        return pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for the AUC of %zu test "
                             "rows", nt);
    }
    for (size_t i = 0; i < nt; i++) { /* as the file stores them */
        p[i] = (float)g->logit[g->train_rows + i];
        y[i] = (float)g->label[g->train_rows + i];
    }
    st->bayes_auc = pst_auc(p, y, nt, scratch);
    st->bayes_logloss = pst_logloss(p, y, nt);
    PST_FREE_ALL(p, y, scratch);
    return PST_OK;
}

static uint64_t distinct_train_ids(const synth *g)
{
    uint64_t total = 0;
    for (int f = 0; f < g->F; f++) {
        const field *fd = &g->fields[f];
        if (fd->bitmap) {
            for (uint64_t w = 0; w < ((uint64_t)fd->vocab + 63) / 64; w++)
                total += (uint64_t)__builtin_popcountll(fd->bitmap[w]);
            continue;
        }
        qsort(fd->list, (size_t)g->train_rows, sizeof *fd->list, by_id);
        for (uint64_t r = 0; r < g->train_rows; r++)
            total += r == 0 || fd->list[r] != fd->list[r - 1];
    }
    return total;
}

static pst_status write_all(FILE *fh, const char *path, const void *p, size_t n)
{
    if (fwrite(p, 1, n, fh) != n)
        return pst_error_set(PST_ERR_IO, "--out %s: %s", path, strerror(errno));
    return PST_OK;
}

static pst_status write_header(FILE *fh, const char *path, const synth *g,
                               const pst_ctr_synth_stats *st)
{
    unsigned char h[64] = {0};
    memcpy(h, "PSTCTR01", 8);
    put32(h + 8, 1);
    put32(h + 12, (uint32_t)g->F);
    put32(h + 16, (uint32_t)g->D);
    put32(h + 20, (uint32_t)g->k);
    put64(h + 24, g->rows);
    put64(h + 32, g->test_rows);
    put64(h + 40, g->cfg->seed);
    putf(h + 48, (float)st->bayes_auc);
    putf(h + 52, (float)st->bayes_logloss);
    PST_TRY(write_all(fh, path, h, sizeof h));
    for (int f = 0; f < g->F; f++) {
        unsigned char v[4];
        put32(v, g->fields[f].vocab);
        PST_TRY(write_all(fh, path, v, sizeof v));
    }
    return PST_OK;
}

/* Rows a thread encodes per write (at least one). */
static uint64_t chunk_rows(const synth *g)
{
    return CHUNK_BYTES / g->record ? CHUNK_BYTES / g->record : 1;
}

/* Pass 2 over all rows, chunk_rows a thread at a time, in file order. */
static pst_status write_rows(FILE *fh, const char *path, const synth *g, job *jobs, int nt,
                             unsigned char *buf)
{
    const uint64_t per_round = chunk_rows(g) * (uint64_t)nt;
    for (uint64_t first = 0; first < g->rows; first += per_round) {
        const uint64_t count = g->rows - first < per_round ? g->rows - first : per_round;
        split(jobs, nt, first, count);
        for (int i = 0; i < nt; i++)
            jobs[i].out = buf + (jobs[i].first - first) * g->record;
        run_jobs(jobs, nt, pass_encode);
        PST_TRY(write_all(fh, path, buf, (size_t)count * g->record));
    }
    return PST_OK;
}

static int threads_of(const pst_ctr_synth_config *cfg)
{
    if (cfg->threads > 0)
        return cfg->threads;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

pst_status pst_ctr_synth_write(const char *path, const pst_ctr_synth_config *cfg,
                               pst_ctr_synth_stats *stats)
{
    PST_TRY(pst_ctr_synth_check(cfg));
    if (!path || !path[0])
        return pst_error_set(PST_ERR_INVALID, "--out: the file to write (example: --out "
                             "ctr.bin)");
    FILE *fh = fopen(path, "wb");
    if (!fh)
        return pst_error_set(PST_ERR_IO, "--out %s: %s", path, strerror(errno));
    struct stat sb;
    const int regular = fstat(fileno(fh), &sb) == 0 && S_ISREG(sb.st_mode);
    synth g;
    pst_ctr_synth_stats st = {0};
    const int nt = threads_of(cfg);
    job jobs[MAX_THREADS];
    memset(jobs, 0, sizeof jobs);
    unsigned char *buf = NULL;
    pst_status s = synth_init(&g, cfg);
    for (int i = 0; s == PST_OK && i < nt; i++) {
        jobs[i].g = &g;
        jobs[i].ids = malloc(sizeof *jobs[i].ids * (size_t)g.F);
        jobs[i].ranks = malloc(sizeof *jobs[i].ranks * (size_t)g.F);
        jobs[i].v = malloc(sizeof *jobs[i].v * (size_t)g.F);
        jobs[i].x = malloc(sizeof *jobs[i].x * (size_t)(g.D ? g.D : 1));
        jobs[i].vec = malloc(sizeof *jobs[i].vec * ((size_t)g.F * (size_t)g.k + 1));
        if (!jobs[i].ids || !jobs[i].ranks || !jobs[i].x || !jobs[i].vec || !jobs[i].v)
            s = pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for thread %d", i);
    }
    if (s == PST_OK && !(buf = malloc((size_t)chunk_rows(&g) * (size_t)nt * g.record)))
        s = pst_error_set(PST_ERR_NOMEM, "ctr-synth: out of memory for the write buffer");
    if (s == PST_OK) {
        split(jobs, nt, 0, g.rows);
        run_jobs(jobs, nt, pass_logits);
        s = label_rows(&g, &st);
    }
    if (s == PST_OK) {
        st.rows = g.rows;
        st.test_rows = g.test_rows;
        for (int f = 0; f < g.F; f++)
            st.vocab_total += g.fields[f].vocab;
        st.distinct_ids_train = distinct_train_ids(&g);
        s = write_header(fh, path, &g, &st);
    }
    if (s == PST_OK)
        s = write_rows(fh, path, &g, jobs, nt, buf);
    if (fclose(fh) != 0 && s == PST_OK)
        s = pst_error_set(PST_ERR_IO, "--out %s: %s", path, strerror(errno));
    if (s != PST_OK && regular)
        unlink(path); /* no half file for a reader to trip on (and never a device) */
    for (int i = 0; i < nt; i++) {
        PST_FREE_ALL(jobs[i].ids, jobs[i].ranks, jobs[i].x, jobs[i].vec, jobs[i].v);
    }
    free(buf);
    synth_free(&g);
    if (s == PST_OK && stats)
        *stats = st;
    return s;
}
