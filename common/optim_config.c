/* optim_config.c — optimizer defaults and the names of kinds and schedules (see
 * optim_config.h). */
#include "common/optim_config.h"

#include <string.h>

static const char *const kind_names[PST_OPTIM_KIND_COUNT_] = {
    [PST_OPTIM_SGD] = "sgd",
    [PST_OPTIM_MOMENTUM] = "momentum",
    [PST_OPTIM_ADAM] = "adam",
    [PST_OPTIM_ADAMW] = "adamw",
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

const char *pst_optim_kind_name(pst_optim_kind k)
{
    if ((unsigned)k >= PST_OPTIM_KIND_COUNT_)
        return "unknown";
    return kind_names[k];
}

int pst_optim_kind_parse(const char *s, pst_optim_kind *out)
{
    if (s == NULL)
        return -1;
    for (int k = 0; k < PST_OPTIM_KIND_COUNT_; k++) {
        if (strcmp(s, kind_names[k]) == 0) {
            *out = (pst_optim_kind)k;
            return 0;
        }
    }
    return -1;
}

const char *pst_lr_schedule_name(pst_lr_schedule s)
{
    if ((unsigned)s >= PST_LR_SCHEDULE_COUNT_)
        return "unknown";
    return schedule_names[s];
}

int pst_lr_schedule_parse(const char *s, pst_lr_schedule *out)
{
    if (s == NULL)
        return -1;
    for (int k = 0; k < PST_LR_SCHEDULE_COUNT_; k++) {
        if (strcmp(s, schedule_names[k]) == 0) {
            *out = (pst_lr_schedule)k;
            return 0;
        }
    }
    return -1;
}
