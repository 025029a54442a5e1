/* optim_config.c — optimizer defaults and the names of kinds and schedules (see
 * optim_config.h). */
#include "common/optim_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const kind_names[PST_OPTIM_KIND_COUNT_] = {
    [PST_OPTIM_SGD] = "sgd",
    [PST_OPTIM_MOMENTUM] = "momentum",
    [PST_OPTIM_ADAM] = "adam",
    [PST_OPTIM_ADAMW] = "adamw",
    [PST_OPTIM_ADAGRAD] = "adagrad",
};

static const char *const schedule_names[PST_LR_SCHEDULE_COUNT_] = {
    [PST_LR_CONSTANT] = "constant",
    [PST_LR_WARMUP_COSINE] = "warmup_cosine",
};

void pst_optim_defaults(pst_optim_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = PST_OPTIM_SGD;
    cfg->lr = 0.01f;
    cfg->momentum = 0.9f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.0f;
    cfg->schedule = PST_LR_CONSTANT;
    cfg->warmup_steps = 0;
    cfg->total_steps = 0;
    cfg->min_lr = 0.0f;
}

/* names[i] for 0 <= i < n, else "unknown". */
static const char *name_of(const char *const *names, int n, int i)
{
    return i >= 0 && i < n ? names[i] : "unknown";
}

/* The i with names[i] equal to s, or -1 (also for NULL). */
static int index_of(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* pst_<id>_name(k) and pst_<id>_parse(s, &k) over names, the n names of type's values */
#define NAMES_API(id, type, names, n)                                                         \
    const char *pst_##id##_name(type k) { return name_of(names, n, (int)k); }                 \
    int pst_##id##_parse(const char *s, type *out)                                            \
    {                                                                                         \
        const int i = index_of(names, n, s);                                                  \
        if (i < 0)                                                                            \
            return -1;                                                                        \
        *out = (type)i;                                                                       \
        return 0;                                                                             \
    }

NAMES_API(optim_kind, pst_optim_kind, kind_names, PST_OPTIM_KIND_COUNT_)
NAMES_API(lr_schedule, pst_lr_schedule, schedule_names, PST_LR_SCHEDULE_COUNT_)

/* ---- ranges ---------------------------------------------------------------------------- */

static const pst_optim_range ranges[] = {
    {"lr", 0.0f, 1e6f, 0},       {"momentum", 0.0f, 1.0f, 0},     {"beta1", 0.0f, 1.0f, 1},
    {"beta2", 0.0f, 1.0f, 1},    {"eps", 0.0f, 1.0f, 0},          {"weight-decay", 0.0f, 1e3f, 0},
    {"min-lr", 0.0f, 1e6f, 0},
};

const pst_optim_range *pst_optim_range_of(const char *name)
{
    for (size_t i = 0; name && i < sizeof ranges / sizeof ranges[0]; i++)
        if (!strcmp(ranges[i].name, name))
            return &ranges[i];
    return NULL;
}

int pst_optim_in_range(const pst_optim_range *r, double v)
{
    return v >= r->lo && (r->hi_open ? v < r->hi : v <= r->hi);
}

const char *pst_optim_range_text(const pst_optim_range *r, char *buf, size_t size)
{
    snprintf(buf, size, "[%g, %g%s", (double)r->lo, (double)r->hi, r->hi_open ? ")" : "]");
    return buf;
}

pst_status pst_optim_check(const pst_optim_config *o)
{
    const struct {
        const char *name;
        float v;
    } f[] = {{"lr", o->lr},   {"momentum", o->momentum},         {"beta1", o->beta1},
             {"beta2", o->beta2}, {"eps", o->eps}, {"weight-decay", o->weight_decay},
             {"min-lr", o->min_lr}};
    char text[64];
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const pst_optim_range *r = pst_optim_range_of(f[i].name);
        if (!pst_optim_in_range(r, f[i].v))
            return pst_error_set(PST_ERR_INVALID, "optimizer %s %g out of range %s", f[i].name,
                                 (double)f[i].v, pst_optim_range_text(r, text, sizeof text));
    }
    if ((o->kind == PST_OPTIM_ADAM || o->kind == PST_OPTIM_ADAMW ||
         o->kind == PST_OPTIM_ADAGRAD) && !(o->eps > 0.0f))
        return pst_error_set(PST_ERR_INVALID, "optimizer eps %g: %s needs eps > 0 (example: "
                             "1e-8)", (double)o->eps, pst_optim_kind_name(o->kind));
    if (o->warmup_steps < 0 || o->total_steps < 0)
        return pst_error_set(PST_ERR_INVALID, "optimizer warmup_steps %ld and total_steps %ld "
                             "must not be negative", o->warmup_steps, o->total_steps);
    return PST_OK;
}
