/* link.c — what the links read of the job's settings (link.h). */
#include "trainer/link.h"

tr_link_settings tr_link_settings_of(const pst_config *c, const tr_plan *p)
{
    tr_link_settings s = {
        .trainer_id = c->trainer_id, .trainers = c->trainers, .mode = c->mode,
        .precision = c->precision, .grad_dtype = c->grad_dtype, .optim = c->optim,
        .settings_fingerprint = tr_settings_fingerprint(p, c),
        .num_pservers = c->num_pservers, .pservers = c->pservers,
        .send_window = c->send_window, .send_ahead = c->send_ahead, .shm = c->shm,
        .chain_len = c->chain_len, .chain = c->chain, .rpc_timeout_ms = c->rpc_timeout_ms,
        .connect_timeout_ms = c->connect_timeout_ms, .peer_timeout_ms = c->peer_timeout_ms,
        .token = c->token, .tls_ca = c->tls_ca, .tls_client_cert = c->tls_client_cert,
        .tls_client_key = c->tls_client_key, .checkpoint_dir = c->checkpoint_dir,
        .checkpoint_keep = c->checkpoint_keep};
    tr_job_id(p, c, s.job_id, sizeof s.job_id);
    return s;
}
