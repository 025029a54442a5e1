/* ops.c — public op wrappers: check the arguments, then dispatch to the op table of the
 * stream's backend (see ops.h, ops_impl.h). The runtime knows nothing of ops: the table is
 * chosen here from the runtime's backend kind. */
#include "common/nn/ops.h"

#include "common/nn/ops_impl.h"
#include "common/runtime/device_impl.h"

static const pst_ops_iface *ops_of(pst_stream *s)
{
    if (!s || !s->dev || !s->dev->rt)
        return NULL;
    switch (pst_runtime_backend(s->dev->rt)) {
    case PST_BACKEND_CPU:
        return &pst_cpu_ops_iface;
#ifdef PSTRAIN_HAVE_CUDA
    case PST_BACKEND_CUDA:
        return &pst_cuda_ops_iface;
#endif
    default:
        return NULL;
    }
}

#define CHECK(cond, what)                                                              \
    do {                                                                               \
        if (!(cond))                                                                   \
            return pst_error_set(PST_ERR_INVALID, "%s: invalid arguments (%s)", what,  \
                                 #cond);                                               \
    } while (0)

pst_status pst_op_linear_forward(pst_stream *s, const pst_linear_fwd_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->out && a->inp && (a->w || a->w16), "linear_forward");
    CHECK(!a->w16 || o == &pst_cpu_ops_iface, "linear_forward");
    CHECK(a->B >= 0 && a->IC > 0 && a->OC > 0, "linear_forward");
    return a->B ? o->linear_forward(s, a) : PST_OK;
}

pst_status pst_op_linear_backward(pst_stream *s, const pst_linear_bwd_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->dout && a->inp && (a->w || a->w16), "linear_backward");
    CHECK(!a->w16 || o == &pst_cpu_ops_iface, "linear_backward");
    CHECK(a->dw || (!a->db && a->dinp), "linear_backward");
    CHECK(a->B > 0 && a->IC > 0 && a->OC > 0, "linear_backward");
    CHECK((a->row1 == 0 && a->row0 == 0) ||
              (a->row0 >= 0 && a->row0 < a->row1 && a->row1 <= a->OC && a->dw &&
               a->row0 % PST_ROW_TILE == 0 &&
               (a->row1 == a->OC || a->row1 % PST_ROW_TILE == 0)),
          "linear_backward");
    return o->linear_backward(s, a);
}

pst_status pst_op_relu_backward(pst_stream *s, const pst_relu_bwd_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->dinp && a->dout && a->out && a->n >= 0, "relu_backward");
    return a->n ? o->relu_backward(s, a) : PST_OK;
}

pst_status pst_op_softmax_xent(pst_stream *s, const pst_xent_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->losses && a->dlogits && a->logits && a->targets, "softmax_xent");
    CHECK(a->B >= 0 && a->C > 0 && a->group >= 0, "softmax_xent");
    CHECK(a->group <= 1 || a->B % a->group == 0, "softmax_xent");
    return a->B ? o->softmax_xent(s, a) : PST_OK;
}

pst_status pst_op_add(pst_stream *s, const pst_add_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->dst && a->src, "add");
    CHECK(!a->bias || (a->width > 0 && a->n % (size_t)a->width == 0), "add");
    return a->n ? o->add(s, a) : PST_OK;
}

pst_status pst_op_cast(pst_stream *s, const pst_cast_args *a)
{
    const pst_ops_iface *o = ops_of(s);
    CHECK(o && a && a->dst && a->src && a->dt < PST_DTYPE_COUNT_ && a->st < PST_DTYPE_COUNT_,
          "cast");
    return a->n ? o->cast(s, a) : PST_OK;
}

/* The sequence ops: every backend has them (ops_impl.h); the arguments are checked here. */
#define SEQ_OP(fn, field, type, cond)                                                      \
    pst_status fn(pst_stream *s, const type *a)                                            \
    {                                                                                      \
        const pst_ops_iface *o = ops_of(s);                                                \
        CHECK(o && a && (cond), #field);                                                   \
        return o->field(s, a);                                                             \
    }

SEQ_OP(pst_op_embedding_forward, embedding_forward, pst_embedding_fwd_args,
       a->out && a->tokens && a->wte && a->wpe && a->B >= 0 && a->T > 0 && a->C > 0)
SEQ_OP(pst_op_embedding_backward, embedding_backward, pst_embedding_bwd_args,
       a->dout && a->tokens && (a->dwte || a->dwpe) && a->B >= 0 && a->T > 0 && a->C > 0 &&
           a->V > 0)
SEQ_OP(pst_op_layernorm_forward, layernorm_forward, pst_layernorm_args,
       a->out && a->mean && a->rstd && a->inp && a->w && a->b && a->N >= 0 && a->C > 0)
SEQ_OP(pst_op_layernorm_backward, layernorm_backward, pst_layernorm_args,
       a->dout && a->inp && a->w && a->saved_mean && a->saved_rstd && (a->dinp || a->dw) &&
           !a->dw == !a->db && a->N >= 0 && a->C > 0)
SEQ_OP(pst_op_attention_forward, attention_forward, pst_attention_args,
       a->out && a->lse && a->qkv && a->scratch && a->B >= 0 && a->T > 0 && a->H > 0 &&
           a->C > 0 && a->C % a->H == 0)
SEQ_OP(pst_op_attention_backward, attention_backward, pst_attention_args,
       a->dqkv && a->dout && a->qkv && a->saved_lse && a->scratch && a->B >= 0 && a->T > 0 &&
           a->H > 0 && a->C > 0 && a->C % a->H == 0)
SEQ_OP(pst_op_gelu_forward, gelu_forward, pst_gelu_args,
       a->out && a->inp && a->n >= 0 && (!a->bias || (a->width > 0 && a->n % a->width == 0)))
SEQ_OP(pst_op_interact_forward, interact_forward, pst_interact_args,
       a->out && a->bottom && a->emb && a->B >= 0 && a->F > 0 && a->dim > 0 &&
           a->emb_stride >= a->F * a->dim)
SEQ_OP(pst_op_interact_backward, interact_backward, pst_interact_args,
       a->dbottom && a->demb && a->dout && a->bottom && a->emb && a->B >= 0 && a->F > 0 &&
           a->dim > 0 && a->emb_stride >= a->F * a->dim && a->demb_stride >= a->F * a->dim)
SEQ_OP(pst_op_bce_logits, bce_logits, pst_bce_args,
       a->losses && a->dlogits && a->logits && a->labels && a->B >= 0)
SEQ_OP(pst_op_gelu_backward, gelu_backward, pst_gelu_args,
       a->out && (a->inp || a->deriv) && a->dout && a->n >= 0 &&
           (!a->dbias || (a->deriv && a->width > 0 && a->n % a->width == 0)))
