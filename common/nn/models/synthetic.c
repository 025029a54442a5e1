/* synthetic.c — the `synthetic` model on the model interface (see models.h): it measures
 * the communication of the real programs with no compute. */
#include <stdlib.h>
#include <string.h>

#include "common/nn/models/models.h"

static void zeros(const pst_model *m, float *dst, uint64_t seed)
{
    (void)seed;
    memset(dst, 0, sizeof(float) * m->nparams);
}

pst_status pst_model_synthetic(pst_model *m, size_t n, int trainer_id)
{
    *m = (pst_model){.name = "synthetic", .target_width = 1, .init_params = zeros};
    pst_status st;
    const int64_t shape[1] = {(int64_t)n};
    if ((st = pst_model_add_tensor(m, "params", 1, shape)) != PST_OK)
        goto error;
    const pst_layer layer = {.cls = &pst_layer_fixed_grad, .tensor = {0}, .ntensors = 1};
    if ((st = pst_model_add_layer(m, &layer)) != PST_OK || (st = pst_model_check(m)) != PST_OK)
        goto error;
    float *g = malloc(sizeof(float) * n);
    if (!g) {
        st = pst_error_set(PST_ERR_NOMEM, "synthetic model: no memory for %zu parameters", n);
        goto error;
    }
    for (size_t i = 0; i < n; i++)
        g[i] = (float)((i * 2654435761u + 977u * (unsigned)trainer_id) % 1000u) * 1e-6f;
    m->data = g;
    return PST_OK;
error:
    pst_model_free(m);
    return st;
}
