/* job.c — the job state of a training run's checkpoints (see train.h): trainer 0's files
 * in DIR/<job>/job, which name the steps every shard holds whole, and what a resumed run
 * offers the pservers (or the in-process store) and checks. Used by both training loops
 * (train.c, ctr.c). */
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "trainer/train.h"

enum { JOB_META = 1, JOB_RESUME = 2 };

typedef struct job_meta {
    int64_t step;         /* the first step to run after resuming */
    uint64_t fingerprint; /* tr_settings_fingerprint */
    uint64_t seed;        /* data order and initialization */
    int64_t trainers, batch;
} job_meta;

static job_meta job_of(const pst_config *cfg, const tr_plan *plan, long step)
{
    return (job_meta){step, tr_settings_fingerprint(plan, cfg), cfg->seed, cfg->trainers,
                      cfg->batch};
}

pst_status tr_job_write(const pst_config *cfg, const tr_plan *plan, const char *dir,
                         long version, const tr_resume_state *rs)
{
    const job_meta meta = job_of(cfg, plan, version);
    pst_ckpt_writer w;
    PST_TRY(pst_ckpt_begin(&w, dir, version));
    pst_status st = pst_ckpt_section(&w, JOB_META, &meta, sizeof meta);
    if (st == PST_OK)
        st = pst_ckpt_section(&w, JOB_RESUME, rs, sizeof *rs);
    if (st != PST_OK) {
        pst_ckpt_abort(&w);
        return st;
    }
    PST_TRY(pst_ckpt_commit(&w));
    return pst_ckpt_prune(dir, cfg->checkpoint_keep);
}

/* The steps of the whole job checkpoints of this job in dir, newest first (a damaged one
 * is skipped with one warning line; one of other settings too, except under a --job-id the
 * user named: -1, with the error set, as that job is not this one). */
static int job_candidates(const pst_config *cfg, const tr_plan *plan, const char *dir,
                          long resume_limit, int64_t *out, tr_resume_state *states, int max,
                          long *newest)
{
    long steps[64];
    const int n = pst_ckpt_list(dir, steps, 64);
    *newest = n ? steps[0] : 0;
    const job_meta want = job_of(cfg, plan, 0);
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        if (resume_limit >= 0 && steps[i] > resume_limit)
            continue;
        pst_ckpt c;
        uint64_t bytes, rbytes;
        if (pst_ckpt_read(&c, dir, steps[i]) != PST_OK) {
            PST_WARN("%s; trying an older one", pst_error_detail());
            continue;
        }
        const job_meta *m = pst_ckpt_find(&c, JOB_META, &bytes);
        const tr_resume_state *rs = pst_ckpt_find(&c, JOB_RESUME, &rbytes);
        const int ours = m && bytes == sizeof *m && m->step == steps[i];
        const int other = ours &&
                          (m->fingerprint != want.fingerprint || m->seed != want.seed ||
                           m->trainers != want.trainers || m->batch != want.batch);
        if (other && cfg->job_id[0]) {
            pst_ckpt_free(&c);
            pst_error_set(PST_ERR_MISMATCH, "--job-id %s: checkpoint %s/step-%012ld.ckpt is of "
                          "that job with other settings (plan, optimizer, seed, trainers or "
                          "batch): resume it with its settings, or name this job another "
                          "--job-id", cfg->job_id, dir, steps[i]);
            return -1;
        }
        if (!ours || !rs || rbytes != sizeof *rs || other)
            PST_WARN("checkpoint %s/step-%012ld.ckpt: of another job (other plan, seed, "
                     "trainers or batch) or of an earlier pstrain; trying an older one", dir,
                     steps[i]);
        else {
            memcpy(&states[k], rs, sizeof *rs); /* the file's bytes may be unaligned */
            out[k++] = steps[i];
        }
        pst_ckpt_free(&c);
    }
    return k;
}

pst_status tr_job_checkpoints(tr_job *job, const pst_config *cfg, const tr_plan *plan,
                              const char *job_id, tr_link *link, char *job_dir, size_t dir_size,
                              int64_t *candidates, tr_resume_state *states, long *newest)
{
    const int rank = cfg->trainer_id;
    if (cfg->checkpoint_dir[0] && cfg->mode == PST_MODE_ASYNC) {
        /* no common step: each pserver's shard holds its blocks' versions and each
         * trainer's steps applied, and a resumed trainer goes on from those */
        link->checkpoint_every = cfg->checkpoint_every;
        link->resume_newest = rank == 0 && cfg->resume != PST_RESUME_NEVER;
    } else if (cfg->checkpoint_dir[0]) {
        snprintf(job_dir, dir_size, "%s/%s/job", cfg->checkpoint_dir, job_id);
        link->checkpoint_every = cfg->checkpoint_every;
        if (rank == 0 && cfg->resume != PST_RESUME_NEVER) {
            link->nresume = job_candidates(cfg, plan, job_dir, job->resume_limit, candidates,
                                           states, TR_RESUME_CANDIDATES, newest);
            link->resume_steps = candidates;
            link->resume_states = states;
            if (link->nresume < 0)
                return PST_ERR_MISMATCH;
        }
    }
    return PST_OK;
}

pst_status tr_job_check_resume(const pst_config *cfg, const tr_link *link, const char *job_dir,
                               long newest, long first, long total)
{
    const int rank = cfg->trainer_id;
    const long job_version = (long)link->start_version;
    if (cfg->checkpoint_dir[0] && cfg->resume == PST_RESUME_REQUIRE && rank == 0 &&
        cfg->mode == PST_MODE_ASYNC && !link->has_start_state)
        return pst_error_set(PST_ERR_NOT_FOUND, "no pserver holds a whole async checkpoint of "
                             "this job in its --checkpoint-dir (see their logs), and --resume "
                             "require does not start afresh (--resume auto does)");
    if (job_dir[0] && cfg->resume == PST_RESUME_REQUIRE && rank == 0 &&
        (job_version == 0 || job_version != newest))
        return pst_error_set(PST_ERR_NOT_FOUND, "the newest checkpoint in %s (step %ld) %s "
                             "(see the warnings above and the pservers' logs), and --resume "
                             "require does not fall back (--resume auto uses an older one)",
                             cfg->checkpoint_dir, newest,
                             newest ? "is not whole" : "does not exist");
    if (first > total)
        return pst_error_set(PST_ERR_INVALID, "the job resumes at step %ld, past its %ld steps "
                             "(example: --steps %ld)", first, total, first + 1);
    return PST_OK;
}

