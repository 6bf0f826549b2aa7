"""The seeded aten ops rngaudit intercepts: a static list, checked against torch's tags."""

from __future__ import annotations

# Every aten op tagged ``nondeterministic_seeded`` that has a real backend kernel (no
# CompositeImplicitAutograd / CompositeExplicitAutograd kernel), as ``name.overload``: the
# "leaf" ops every random draw ends in. Composites (``rand``, ``randn``, ``randint``,
# ``dropout``, ``rrelu``, ...) reach these, so they are seen as their leaf (``torch.rand`` ->
# ``aten.uniform_``). Deriving the list from tags at run time costs 42 ms to 0.4 s;
# tests/test_torch_ops.py checks it against the installed torch.
LEAF_OPS: tuple[str, ...] = (
    "_cudnn_attention_forward.default",
    "_cudnn_init_dropout_state.default",
    "_cudnn_rnn.default",
    "_efficient_attention_forward.default",
    "_fill_mem_eff_dropout_mask_.default",
    "_flash_attention_forward.default",
    "_flash_attention_forward.quantized",
    "_flash_attention_forward_no_dropout_inplace.default",
    "_fused_dropout.default",
    "_lstm_mps.default",
    "_nested_tensor_softmax_with_shape.default",
    "_sample_dirichlet.default",
    "_scaled_dot_product_attention_math_for_mps.default",
    "_scaled_dot_product_cudnn_attention.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_flash_attention.quantized",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_standard_gamma.default",
    "_triton_scaled_dot_attention.default",
    "bernoulli.out",
    "bernoulli.p",
    "bernoulli_.Tensor",
    "bernoulli_.float",
    "binomial.default",
    "cauchy_.default",
    "exponential_.default",
    "geometric_.default",
    "log_normal_.default",
    "miopen_rnn.default",
    "multinomial.default",
    "multinomial.out",
    "native_dropout.default",
    "normal.Tensor_Tensor",
    "normal.Tensor_Tensor_out",
    "normal.Tensor_float",
    "normal.Tensor_float_out",
    "normal.float_Tensor",
    "normal.float_Tensor_out",
    "normal_.default",
    "poisson.default",
    "random_.default",
    "random_.from",
    "random_.to",
    "randperm.generator_out",
    "rrelu_with_noise.default",
    "rrelu_with_noise.out",
    "rrelu_with_noise_.default",
    "uniform_.default",
)

# Tagged seeded, with a backend kernel, but they consume nothing from a generator.
NOT_DRAWS: dict[str, str] = {
    "_fused_sdp_choice.default": "picks an attention kernel (returns an int)",
    "_cudnn_attention_backward.default": "backward: replays the forward's seed and offset",
    "_scaled_dot_product_cudnn_attention_backward.default": "backward: replays seed and offset",
    "_scaled_dot_product_efficient_attention_backward.default": "backward: replays seed, offset",
}

# An argument with one of these names and this value means the call draws nothing
# (``rrelu(training=False)``, ``_cudnn_rnn(train=False)``, attention with ``dropout_p=0``).
NO_DRAW_WHEN: dict[str, object] = {"training": False, "train": False, "dropout_p": 0.0}
