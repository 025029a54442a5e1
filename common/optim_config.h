/* optim_config.h — the optimizer's settings: kinds, learning-rate schedules, their names
 * and defaults. Plain configuration, so the config module (base) can parse them without
 * depending on the network library; the update math is in optim.h. */
#ifndef PST_OPTIM_CONFIG_H
#define PST_OPTIM_CONFIG_H

#include <stddef.h>

#include "common/error.h"

typedef enum pst_optim_kind {
    PST_OPTIM_SGD = 0,
    PST_OPTIM_MOMENTUM,
    PST_OPTIM_ADAM,
    PST_OPTIM_ADAMW,
    PST_OPTIM_ADAGRAD,  /* the click model's (torch_dlrm.py), dense and sparse */
    PST_OPTIM_KIND_COUNT_
} pst_optim_kind;

typedef enum pst_lr_schedule {
    PST_LR_CONSTANT = 0,
    PST_LR_WARMUP_COSINE, /* linear warmup from 0 over warmup_steps, then cosine to min_lr
                           * (exact definition at pst_lr_at) */
    PST_LR_SCHEDULE_COUNT_
} pst_lr_schedule;

typedef struct pst_optim_config {
    pst_optim_kind kind;
    float lr;
    float momentum;     /* momentum: mu */
    float beta1, beta2; /* Adam/AdamW */
    float eps;
    float weight_decay;
    pst_lr_schedule schedule;
    long warmup_steps;  /* warmup_cosine */
    long total_steps;   /* warmup_cosine: cosine reaches min_lr at total_steps */
    float min_lr;
} pst_optim_config;

/* SGD, lr 0.01, momentum 0.9, betas 0.9/0.999, eps 1e-8, wd 0, constant schedule,
 * warmup_steps 0, total_steps 0, min_lr 0. */
void pst_optim_defaults(pst_optim_config *cfg);
/* "sgd", "momentum", "adam", "adamw" <-> kind. Names are static strings, never NULL
 * ("unknown" outside the enum). Parse is exact and case-sensitive; it returns 0, or -1 for
 * NULL or an unknown name and then leaves *out unchanged. Same for schedules. */
const char *pst_optim_kind_name(pst_optim_kind k);
int pst_optim_kind_parse(const char *s, pst_optim_kind *out);
const char *pst_lr_schedule_name(pst_lr_schedule s);
int pst_lr_schedule_parse(const char *s, pst_lr_schedule *out); /* "constant", "warmup_cosine" */

/* The range of one float setting: lo <= v, and v <= hi (v < hi when hi_open). */
typedef struct pst_optim_range {
    const char *name; /* the flag's name: "lr", "momentum", "beta1", "beta2", "eps",
                       * "weight-decay", "min-lr" */
    float lo, hi;
    int hi_open;
} pst_optim_range;

/* The range of the setting `name` (a flag's name), or NULL when it has none. The one table
 * of ranges: the trainer's flags (config.c) and a pserver's Init (service.c) are checked
 * against it. */
const pst_optim_range *pst_optim_range_of(const char *name);
/* 1 when v is inside r. */
int pst_optim_in_range(const pst_optim_range *r, double v);
/* "[0, 1)"-style text of r, into buf. */
const char *pst_optim_range_text(const pst_optim_range *r, char *buf, size_t size);
/* Every setting of o in its range, Adam's eps > 0, warmup and total steps not negative:
 * PST_OK, or PST_ERR_INVALID with a detail naming the setting, its value and the range
 * ("optimizer beta1 1 out of range [0, 1)"). */
pst_status pst_optim_check(const pst_optim_config *o);

#endif /* PST_OPTIM_CONFIG_H */
