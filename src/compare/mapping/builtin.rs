//! The built-in mapping table: the equivalences every compare knows without a file.
//!
//! Each rule is one computation that the two kinds of run commonly spell differently: a
//! fused kernel (torch_npu's, or a torch API that does the whole thing in one call) on one
//! side, the ops of a hand-written composition on the other. docs/compare.md ("Mapping
//! files") lists every entry with what it means; a unit test checks that the page names
//! every rule and every API it names, so the two cannot drift apart.
//!
//! Names are API names as both probe's agent and msprobe write them (`{ApiType}.{api}`:
//! `Tensor`, `Torch`, `Functional`, `NPU`, `VF`, `Aten`, `Distributed`). A trailing `*`
//! stands for every API name with that beginning (`Torch._foreach_*`).

/// One built-in rule, as data. The composition is a list of groups, one per elementary
/// operation with every spelling of it (`MUL`: `Tensor.__mul__`, `Tensor.mul`, ...), so that
/// each rule accepts the same spellings of the operations it shares with another.
pub(super) struct Builtin {
    pub name: &'static str,
    pub fused: &'static [&'static str],
    pub composition: &'static [&'static [&'static str]],
}

/// Views, layout changes, copies and casts: ops that move or re-type values without
/// computing new ones. Either side of a region may hold them wherever the implementation
/// needed them (a `.contiguous()` before a kernel, a `.float()` around a softmax), so region
/// matching ignores them.
pub(super) const PASSTHROUGH: &[&str] = &[
    "Tensor.view",
    "Tensor.view_as",
    "Tensor.reshape",
    "Tensor.reshape_as",
    "Tensor.transpose",
    "Tensor.transpose_",
    "Tensor.permute",
    "Tensor.contiguous",
    "Tensor.unsqueeze",
    "Tensor.unsqueeze_",
    "Tensor.squeeze",
    "Tensor.squeeze_",
    "Tensor.expand",
    "Tensor.expand_as",
    "Tensor.broadcast_to",
    "Tensor.flatten",
    "Tensor.unflatten",
    "Tensor.unbind",
    "Tensor.t",
    "Tensor.movedim",
    "Tensor.swapaxes",
    "Tensor.swapdims",
    "Tensor.to",
    "Tensor.float",
    "Tensor.half",
    "Tensor.bfloat16",
    "Tensor.double",
    "Tensor.type",
    "Tensor.type_as",
    "Tensor.clone",
    "Tensor.detach",
    "Tensor.cpu",
    "Tensor.cuda",
    "Tensor.npu",
    "Torch.reshape",
    "Torch.transpose",
    "Torch.permute",
    "Torch.unsqueeze",
    "Torch.squeeze",
    "Torch.broadcast_to",
    "Torch.flatten",
    "Torch.unflatten",
    "Torch.unbind",
    "Torch.t",
    "Torch.movedim",
    "Torch.swapaxes",
    "Torch.swapdims",
    "Torch.clone",
    "Torch.detach",
    "NPU.npu_format_cast",
    "NPU.npu_format_cast_",
    "NPU.npu_dtype_cast",
    "NPU.npu_transpose",
    "NPU.npu_confusion_transpose",
    "NPU.npu_broadcast",
    "NPU.npu_reshape",
    "Aten.view",
    "Aten._unsafe_view",
    "Aten.reshape",
    "Aten.transpose",
    "Aten.permute",
    "Aten.t",
    "Aten.expand",
    "Aten.unsqueeze",
    "Aten.squeeze",
    "Aten.clone",
    "Aten._to_copy",
    // AMP's loss-scaler bookkeeping (found_inf, the scale): not the model's computation, and
    // on one side only when only one run scales its loss (compare's loss scaling).
    "Torch._amp_update_scale_",
    "Torch._amp_foreach_non_finite_check_and_unscale_",
    "Aten._amp_update_scale_",
    "Aten._amp_foreach_non_finite_check_and_unscale_",
];

// The spellings of elementary operations in dumps: method, torch function, operator.
const MATMUL: &[&str] = &[
    "Torch.matmul",
    "Tensor.matmul",
    "Tensor.__matmul__",
    "Torch.bmm",
    "Tensor.bmm",
    "Torch.baddbmm",
    "Tensor.baddbmm",
    "Torch.mm",
    "Tensor.mm",
    "Torch.addmm",
    "Torch.einsum",
];
const SOFTMAX: &[&str] = &["Functional.softmax", "Torch.softmax", "Tensor.softmax"];
const ADD: &[&str] = &[
    "Tensor.__add__",
    "Tensor.__radd__",
    "Tensor.add",
    "Torch.add",
];
const SUB: &[&str] = &["Tensor.__sub__", "Tensor.sub", "Torch.sub"];
const MUL: &[&str] = &[
    "Tensor.__mul__",
    "Tensor.__rmul__",
    "Tensor.mul",
    "Torch.mul",
];
const DIV: &[&str] = &["Tensor.__truediv__", "Tensor.div", "Torch.div"];
const NEG: &[&str] = &["Tensor.__neg__", "Tensor.neg", "Torch.neg"];
const POW: &[&str] = &[
    "Tensor.pow",
    "Torch.pow",
    "Tensor.__pow__",
    "Tensor.square",
    "Torch.square",
];
const SQRT: &[&str] = &["Tensor.sqrt", "Torch.sqrt", "Tensor.rsqrt", "Torch.rsqrt"];
const MEAN: &[&str] = &["Tensor.mean", "Torch.mean"];
const MASK: &[&str] = &[
    "Tensor.masked_fill",
    "Tensor.masked_fill_",
    "Torch.masked_fill",
    "Torch.where",
    "Torch.tril",
    "Torch.triu",
];
const DROPOUT: &[&str] = &["Functional.dropout", "Torch.dropout"];
const HALVES: &[&str] = &[
    "Tensor.chunk",
    "Torch.chunk",
    "Tensor.split",
    "Torch.split",
    "Tensor.__getitem__",
];
const SIGMOID: &[&str] = &["Torch.sigmoid", "Tensor.sigmoid", "Functional.sigmoid"];

/// The rules, most specific first: [`super::Mapping::rule_for`] returns the first rule
/// that fits, so a region that several rules could explain is named by the narrowest.
pub(super) const RULES: &[Builtin] = &[
    Builtin {
        name: "attention",
        fused: &[
            "Functional.scaled_dot_product_attention",
            "NPU.npu_fusion_attention",
            "NPU.npu_fused_infer_attention_score",
            "NPU.npu_prompt_flash_attention",
            "NPU.npu_incre_flash_attention",
            "NPU.npu_flash_attention",
        ],
        composition: &[
            MATMUL,
            SOFTMAX,
            DIV,
            MUL,
            ADD,
            MASK,
            DROPOUT,
            // Grouped-query attention repeats K and V for every query head.
            &[
                "Torch.repeat_interleave",
                "Tensor.repeat_interleave",
                "Tensor.repeat",
            ],
        ],
    },
    Builtin {
        name: "masked_softmax",
        fused: &[
            "NPU.npu_scaled_masked_softmax",
            "NPU.npu_dropout_with_add_softmax",
        ],
        composition: &[SOFTMAX, MUL, DIV, ADD, MASK, DROPOUT],
    },
    Builtin {
        name: "rms_norm",
        fused: &[
            "Functional.rms_norm",
            "Torch.rms_norm",
            "NPU.npu_rms_norm",
            "NPU.npu_add_rms_norm",
        ],
        composition: &[POW, MEAN, ADD, SQRT, DIV, MUL],
    },
    Builtin {
        name: "layer_norm",
        fused: &[
            "Functional.layer_norm",
            "Torch.layer_norm",
            "Torch.native_layer_norm",
            "NPU.npu_layer_norm_eval",
        ],
        composition: &[
            MEAN,
            &[
                "Tensor.var",
                "Torch.var",
                "Torch.var_mean",
                "Tensor.std",
                "Torch.std",
            ],
            SUB,
            POW,
            ADD,
            SQRT,
            DIV,
            MUL,
        ],
    },
    Builtin {
        name: "rotary",
        fused: &["NPU.npu_rotary_mul", "NPU.npu_apply_rotary_pos_emb"],
        composition: &[
            MUL,
            ADD,
            SUB,
            NEG,
            HALVES,
            &["Torch.cat", "Torch.stack"],
            // The complex-number spelling: rotate by multiplying complex numbers.
            &["Torch.view_as_complex", "Torch.view_as_real"],
        ],
    },
    Builtin {
        name: "swiglu",
        fused: &["NPU.npu_swiglu"],
        composition: &[&["Functional.silu", "NPU.npu_silu"], SIGMOID, HALVES, MUL],
    },
    Builtin {
        name: "geglu",
        fused: &["NPU.npu_geglu"],
        composition: &[&["Functional.gelu", "NPU.npu_gelu"], HALVES, MUL],
    },
    Builtin {
        name: "gelu",
        fused: &[
            "Functional.gelu",
            "NPU.npu_gelu",
            "NPU.fast_gelu",
            "NPU.npu_fast_gelu",
        ],
        composition: &[
            &[
                "Torch.tanh",
                "Tensor.tanh",
                "Functional.tanh",
                "Torch.erf",
                "Tensor.erf",
            ],
            SIGMOID,
            POW,
            MUL,
            ADD,
            DIV,
        ],
    },
    Builtin {
        name: "silu",
        fused: &["Functional.silu", "NPU.npu_silu"],
        composition: &[SIGMOID, MUL],
    },
    Builtin {
        name: "linear",
        fused: &["Functional.linear", "NPU.npu_linear", "NPU.npu_bmmV2"],
        composition: &[MATMUL, ADD],
    },
    Builtin {
        name: "cross_entropy",
        fused: &[
            "Functional.cross_entropy",
            "NPU.npu_softmax_cross_entropy_with_logits",
            "NPU.npu_cross_entropy_loss",
        ],
        composition: &[
            &[
                "Functional.log_softmax",
                "Torch.log_softmax",
                "Tensor.log_softmax",
                "Torch.log",
                "Tensor.log",
            ],
            SOFTMAX,
            &[
                "Functional.nll_loss",
                "Torch.gather",
                "Tensor.gather",
                "Tensor.sum",
                "Torch.sum",
            ],
            NEG,
            MUL,
            MEAN,
            DIV,
        ],
    },
    Builtin {
        name: "adam",
        fused: &[
            "NPU.npu_apply_adam_w",
            "NPU.npu_apply_adam",
            "NPU.npu_bert_apply_adam",
            "Torch._fused_adam_",
            "Torch._fused_adamw_",
            "Torch._fused_adam",
            "Torch._fused_adamw",
            "Torch._foreach_*",
        ],
        composition: &[
            // The in-place updates of the per-tensor loop.
            &[
                "Tensor.mul_",
                "Tensor.add_",
                "Tensor.sub_",
                "Tensor.addcmul_",
                "Tensor.addcdiv_",
                "Tensor.lerp_",
                "Tensor.div_",
                "Tensor.sqrt_",
                "Tensor.copy_",
                "Tensor.__imul__",
                "Tensor.__iadd__",
                "Tensor.__itruediv__",
                "Torch.addcmul",
                "Torch.addcdiv",
                "Torch.lerp",
                "Torch.maximum",
                "Tensor.maximum",
            ],
            SQRT,
            DIV,
            MUL,
            ADD,
        ],
    },
];
