"""Regenerate ``probe/api_list.json`` from the installed PyTorch.

The hooked API list is data, not code, so that users can review and edit it and so that a
newer PyTorch only needs a regeneration, not a code change. Names missing from the running
PyTorch are skipped at hook time, so a list generated on one version works on others.

Run: ``python python/tools/gen_api_list.py > python/probe/api_list.json``
"""

from __future__ import annotations

import inspect
import json
import types

import torch
import torch.nn.functional as F

# Functions that are not numerical operators (introspection, RNG state, dtype queries,
# factories without tensor inputs): hooking them only adds noise and overhead.
SKIP_PREFIXES = ("is_", "set_", "get_", "can_", "use_", "has_", "are_", "empty", "from_")
SKIP_TORCH = {
    "manual_seed",
    "seed",
    "initial_seed",
    "result_type",
    "promote_types",
    "tensor",
    "as_tensor",
    "asarray",
    "scalar_tensor",
    "zeros",
    "ones",
    "full",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "bartlett_window",
    "blackman_window",
    "hamming_window",
    "hann_window",
    "kaiser_window",
    "tril_indices",
    "triu_indices",
    "sym_constrain_range",
    "sym_constrain_range_for_size",
    "numel",
    "typename",
    "save",
    "load",
    "compile",
    "vmap",
    "cond",
    "autocast",
    "sparse_coo_tensor",
    "sparse_csr_tensor",
    "sparse_csc_tensor",
    "sparse_bsr_tensor",
    "sparse_bsc_tensor",
    "sparse_compressed_tensor",
    "quantize_per_tensor_dynamic",
    "clear_autocast_cache",
    "dsmm",
    "saddmm",
    "spmm",
    "hspmm",
    "smm",
    "sspaddmm",
}
SKIP_FUNCTIONAL = {
    "Optional",
    "assert_int_or_pair",
    "boolean_dispatch",
    "handle_torch_function",
    "has_torch_function",
    "has_torch_function_unary",
    "has_torch_function_variadic",
}
# Tensor methods: keep operators; drop Python protocol, introspection, autograd plumbing.
TENSOR_DUNDERS = [
    "__abs__",
    "__add__",
    "__and__",
    "__div__",
    "__floordiv__",
    "__getitem__",
    "__iadd__",
    "__iand__",
    "__idiv__",
    "__ifloordiv__",
    "__ilshift__",
    "__imod__",
    "__imul__",
    "__invert__",
    "__ior__",
    "__ipow__",
    "__irshift__",
    "__isub__",
    "__itruediv__",
    "__ixor__",
    "__lshift__",
    "__matmul__",
    "__mod__",
    "__mul__",
    "__neg__",
    "__or__",
    "__pos__",
    "__pow__",
    "__radd__",
    "__rand__",
    "__rdiv__",
    "__rfloordiv__",
    "__rlshift__",
    "__rmatmul__",
    "__rmod__",
    "__rmul__",
    "__ror__",
    "__rpow__",
    "__rrshift__",
    "__rshift__",
    "__rsub__",
    "__rtruediv__",
    "__rxor__",
    "__setitem__",
    "__sub__",
    "__truediv__",
    "__xor__",
]
SKIP_TENSOR = {
    "backward",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "retain_grad",
    "requires_grad_",
    "item",
    "tolist",
    "numpy",
    "size",
    "dim",
    "stride",
    "storage",
    "untyped_storage",
    "storage_offset",
    "storage_type",
    "data_ptr",
    "element_size",
    "nelement",
    "numel",
    "ndimension",
    "get_device",
    "dim_order",
    "nbytes",
    "itemsize",
    "type",
    "new",
    "new_tensor",
    "new_empty",
    "new_empty_strided",
    "new_zeros",
    "new_ones",
    "new_full",
    "share_memory_",
    "pin_memory",
    "record_stream",
    "apply_",
    "map_",
    "map2_",
    "module_load",
    "as_subclass",
    "detach_",
    "resize_",
    "resize_as_",
    "set_",
    "coalesce",
    "indices",
    "values",
    "crow_indices",
    "col_indices",
    "ccol_indices",
    "row_indices",
    "dense_dim",
    "sparse_dim",
    "to_sparse",
    "sparse_mask",
    "q_scale",
    "q_zero_point",
    "q_per_channel_scales",
    "q_per_channel_zero_points",
    "q_per_channel_axis",
    "qscheme",
    "int_repr",
    "dequantize",
    "refine_names",
    "rename",
    "rename_",
    "align_to",
    "align_as",
    "unflatten",
    "data",
    "grad",
    "smm",
    "sspaddmm",
    "to_dense",
    "to_mkldnn",
    "to_padded_tensor",
    "reinforce",
    "cpu_",
    "is_shared",
    "const_data_ptr",
    "mutable_data_ptr",
    "ipu",
    "mtia",
    "xpu",
    "hpu",
    "hash_tensor",
}
DISTRIBUTED = [
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_all_gather_base",  # the deprecated names older Megatron-LM calls (msprobe hooks them)
    "_reduce_scatter_base",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "scatter",
    "gather",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
    "batch_isend_irecv",
]
#: ``torch.distributed._functional_collectives``: the collectives DTensor runs (tensor
#: parallelism's all-reduces and all-gathers, when a placement changes), recorded as
#: ``Distributed.<name>``. msprobe does not hook them.
FUNCOL = [
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
    "permute_tensor",
]
#: ``torch._VF``: the recurrent kernels ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` (and their
#: cells) call. msprobe hooks ``lstm`` there.
VF = [
    "lstm",
    "gru",
    "rnn_tanh",
    "rnn_relu",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
]
NPU = [
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "npu_geglu",
    "npu_confusion_transpose",
    "npu_scaled_masked_softmax",
    "npu_dropout_with_add_softmax",
    "npu_incre_flash_attention",
    "npu_prompt_flash_attention",
    "npu_fused_infer_attention_score",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing",
    "npu_moe_finalize_routing",
    "npu_grouped_matmul",
    "npu_format_cast",
    "fast_gelu",
    "npu_fast_gelu",
    "npu_bmmV2",
    "npu_linear",
    "npu_layer_norm_eval",
    "npu_gelu",
    "npu_silu",
    "npu_mish",
    "npu_add_rms_norm",
    "npu_apply_rotary_pos_emb",
    "npu_mm_all_reduce_base",
    "npu_quant_matmul",
    "npu_weight_quant_batchmatmul",
    "npu_anti_quant",
    "npu_quantize",
    "npu_dtype_cast",
    "npu_scatter_nd_update",
    "npu_ps_roi_pooling",
    "npu_softmax_cross_entropy_with_logits",
    "npu_transpose",
    "npu_broadcast",
    "npu_dropout",
    "npu_dropout_do_mask",
    "npu_dropout_gen_mask",
]


#: Under ``Torch``, beside torch's own functions: ``torch.linalg``'s functions as
#: ``linalg.<name>`` (the clipping's total norm is ``linalg.vector_norm``), as msprobe hooks
#: them; and AMP's loss-scale update, whose ``found_inf`` says the scaler skipped the step
#: (``probe scan``).
TORCH_EXTRA = ["_amp_update_scale_"]
#: The multi-tensor ops (``torch._foreach_*``), private but what a step runs on GPUs:
#: ``clip_grad_norm_`` takes every gradient's norm with ``_foreach_norm`` and scales them with
#: ``_foreach_mul_``, and the multi-tensor optimizers (PyTorch's default on CUDA) update
#: with ``_foreach_lerp_``, ``_foreach_addcdiv_`` and the like. Unhooked, the gradients and
#: weights they wrote had no captured producer: a port without the clipping was
#: misdiagnosed. Every one the installed PyTorch has, in-place and out-of-place.
FOREACH_PREFIX = "_foreach_"


def _skip(name: str) -> bool:
    return name.startswith("_") or name.startswith(SKIP_PREFIXES)


def main() -> None:
    variable_functions = set(dir(torch._C._VariableFunctions))
    torch_ops = sorted(
        n
        for n in dir(torch)
        if n in variable_functions
        and not _skip(n)
        and n not in SKIP_TORCH
        and not (n.endswith("_like") and n != "where")  # factories: only the shape is used
    )
    # Python-level operators in torch.functional (not in _VariableFunctions).
    for extra in (
        "einsum",
        "split",
        "norm",
        "tensordot",
        "cdist",
        "chain_matmul",
        "broadcast_tensors",
        "unique",
        "unique_consecutive",
        "stft",
        "istft",
        "cartesian_prod",
        "block_diag",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
    ):
        if hasattr(torch, extra) and extra not in torch_ops:
            torch_ops.append(extra)
    torch_ops += [n for n in TORCH_EXTRA if hasattr(torch, n)]
    torch_ops += [
        n for n in variable_functions if n.startswith(FOREACH_PREFIX) and hasattr(torch, n)
    ]
    torch_ops += [
        f"linalg.{n}"
        for n in dir(torch.linalg)
        if not n.startswith("_")
        and callable(getattr(torch.linalg, n))
        and not inspect.isclass(getattr(torch.linalg, n))
    ]
    functional = sorted(
        n
        for n in dir(F)
        if not n.startswith("_")
        and n not in SKIP_FUNCTIONAL
        and callable(getattr(F, n))
        and not inspect.isclass(getattr(F, n))
        and not inspect.ismodule(getattr(F, n))
    )
    tensor = []
    for n in dir(torch.Tensor):
        if n.startswith("_") or n in SKIP_TENSOR or n.startswith(SKIP_PREFIXES):
            continue
        a = inspect.getattr_static(torch.Tensor, n)
        if isinstance(a, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
            continue
        if callable(a):
            tensor.append(n)
    tensor = sorted(set(tensor) | set(TENSOR_DUNDERS))
    out = {
        "_comment": "APIs hooked by probe at api level. Regenerate with "
        "python/tools/gen_api_list.py; edit freely. Names absent at run time are skipped.",
        "Torch": sorted(set(torch_ops)),
        "Functional": functional,
        "Tensor": tensor,
        "Distributed": DISTRIBUTED,
        "Funcol": FUNCOL,
        "VF": VF,
        "NPU": NPU,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
