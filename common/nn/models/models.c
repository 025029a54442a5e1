/* models.c — the model a configuration names (see models.h). */
#include <string.h>

#include "common/nn/models/models.h"

pst_status pst_model_from_config(pst_model *m, const pst_config *cfg, int in_dim, int nclasses)
{
    if (strcmp(cfg->model, "mlp") == 0)
        return pst_model_mlp(m, in_dim, nclasses, cfg->nhidden, cfg->hidden);
    if (strcmp(cfg->model, "gpt") == 0)
        return pst_model_gpt(m, nclasses, cfg->ctx, cfg->layers, cfg->heads, cfg->embd);
    if (strcmp(cfg->model, "synthetic") == 0)
        return pst_model_synthetic(m, (size_t)cfg->params, cfg->trainer_id);
    memset(m, 0, sizeof *m);
    return pst_error_set(PST_ERR_INVALID, "--model %s: unknown model (mlp, gpt or synthetic)",
                         cfg->model);
}

int pst_model_reads_data(const pst_config *cfg)
{
    return strcmp(cfg->model, "synthetic") != 0;
}
