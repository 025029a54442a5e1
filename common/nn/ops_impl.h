/* ops_impl.h — the op table a device backend provides (private; see ops.h for the
 * meaning of each op). Each member queues its op on `s` and returns at once; the public
 * wrappers in ops.c have already checked the arguments. */
#ifndef PST_OPS_IMPL_H
#define PST_OPS_IMPL_H

#include "common/nn/ops.h"

typedef struct pst_ops_iface {
    pst_status (*linear_forward)(pst_stream *s, const pst_linear_fwd_args *a);
    pst_status (*linear_backward)(pst_stream *s, const pst_linear_bwd_args *a);
    pst_status (*relu_backward)(pst_stream *s, const pst_relu_bwd_args *a);
    pst_status (*softmax_xent)(pst_stream *s, const pst_xent_args *a);
    pst_status (*add)(pst_stream *s, const pst_add_args *a);
    pst_status (*cast)(pst_stream *s, const pst_cast_args *a);
    /* the sequence ops (seq_layers.h) */
    pst_status (*embedding_forward)(pst_stream *s, const pst_embedding_fwd_args *a);
    pst_status (*embedding_backward)(pst_stream *s, const pst_embedding_bwd_args *a);
    pst_status (*layernorm_forward)(pst_stream *s, const pst_layernorm_args *a);
    pst_status (*layernorm_backward)(pst_stream *s, const pst_layernorm_args *a);
    pst_status (*attention_forward)(pst_stream *s, const pst_attention_args *a);
    pst_status (*attention_backward)(pst_stream *s, const pst_attention_args *a);
    pst_status (*gelu_forward)(pst_stream *s, const pst_gelu_args *a);
    pst_status (*gelu_backward)(pst_stream *s, const pst_gelu_args *a);
    /* the click model's ops (ctr_layers.h) */
    pst_status (*interact_forward)(pst_stream *s, const pst_interact_args *a);
    pst_status (*interact_backward)(pst_stream *s, const pst_interact_args *a);
    pst_status (*bce_logits)(pst_stream *s, const pst_bce_args *a);
} pst_ops_iface;

/* The CPU implementation (ops_cpu.c): host functions on the stream's worker, over the
 * reference kernels of layers.h and optim.h. */
extern const pst_ops_iface pst_cpu_ops_iface;
#ifdef PSTRAIN_HAVE_CUDA
/* The CUDA implementation (cuda/ops_cuda.cu): kernels and cuBLAS on the stream. */
extern const pst_ops_iface pst_cuda_ops_iface;
#endif

#endif /* PST_OPS_IMPL_H */
