"""Training precisions the cost model knows: which matmuls run at which rate, what the FP8
casts cost in memory traffic, and what FP8 changes on the wire and in memory.

    from fm_pipeline.planner.precision import get_precision
    p = get_precision("fp8")          # = fp8-tensorwise
    p.fp8, p.gather_bytes, p.cast          # cast bytes: (input, weight, grad_output)

bf16 and fp32 run every matmul in that dtype. The FP8 recipes run the transformer blocks'
linear layers (Q/K/V/O, the MLP, routed and shared experts) in FP8, forward and both
backward GEMMs; attention scores, the router, the output layer, norms and element-wise
work stay in BF16, as torchao's Float8Linear conversion (torchtitan skips `output`) and
Transformer Engine run them. Activations, tensor/context-parallel traffic and gradients
stay BF16 / fp32; the optimizer's state is unchanged.

Cast traffic per element of each GEMM operand, forward plus backward, follows torchao's own
roofline model (torchao/testing/float8/roofline_utils.py, `get_tensor_memory_traffic_ovhd_s`)
with its fusion modelling on, because every published FP8 run fuses the first read of an
activation or gradient into the op that produced it (torch.compile in torchtitan, fused
norm/activation + cast kernels in Transformer Engine): bf16 read 2 bytes, fp8 write 1 byte.
- tensorwise: one scale per tensor. Activations and output gradients: the amax fused, one
  cast writing row- and column-major FP8 copies (2 + 1 + 1); the weight (not fused): amax,
  then a cast forward and one backward (2 + 3 + 3). FSDP gathers the weights already in
  FP8 (torchao's enable_fsdp_float8_all_gather; Megatron's --fp8-param-gather).
- rowwise: one scale per row, so each operand is scaled along both axes: a fused cast that
  also writes a transposed BF16 copy, then a cast of the copy (3 + 3); the weight 3 + 4 + 3.
  Weights travel in BF16 (torchao gathers rowwise weights in high precision).
- blockwise: DeepSeek-V3's 1x128 activation tiles and 128x128 weight blocks (section
  3.3 of its report): local scales need no amax pass; each operand is cast once per GEMM
  orientation (fused 1 + 3; the weight 3 + 3), like torchao's MX recipes. Tokens are
  dispatched to experts in FP8 (combined in BF16), as DeepSeek-V3 does.
FP8 GEMMs reach the same share of their (2x) peak as BF16 GEMMs of theirs: torchao's model
uses 0.78 for both on H100 ("pct_achievable_gemm_tops"), and a cuBLASLt E4M3 8192^3 GEMM
measured ~1,610 of 1,979 TFLOP/s (0.81) against BF16's 0.80 in the catalog.

Memory: the linear layers' inputs are kept for the backward as their FP8 casts (1 byte
instead of 2; planner.memory). Weights cost what BF16 weights cost: FP8 primary weights
(NeMo's fp8_params, Megatron's --fp8-param-gather) hold an FP8 copy and its transpose in
place of the BF16 one, and under FSDP the FP8 weight is gathered and freed per layer.
Scales are one fp32 per tensor, row or 128-block: at most 4 / (2 x 128) of a tensor's
bytes, not counted.
MFU stays against the BF16 peak (as Megatron, NeMo and torchtitan report FP8 runs), so FP8
and BF16 plans compare on one scale.
"""

from __future__ import annotations

from dataclasses import dataclass

from fm_pipeline.planner.errors import PlanInputError


@dataclass(frozen=True)
class Precision:
    name: str
    act_bytes: int  # activations, tensor/context-parallel and pipeline traffic
    fp8: bool = False  # the blocks' linear layers run in FP8
    gather_bytes: int = 2  # bytes per linear weight in FSDP / ZeRO weight all-gathers
    dispatch_bytes: int = 2  # bytes per element of a token sent to its experts (forward)
    cast: tuple[float, float, float] = (0.0, 0.0, 0.0)  # bytes/element: input, weight, grad_out

    @property
    def compute_dtype(self) -> str:
        """The peak the non-FP8 matmuls run at, and the peak MFU is quoted against."""
        return "fp32" if self.name == "fp32" else "bf16"


PRECISIONS: dict[str, Precision] = {
    "bf16": Precision("bf16", act_bytes=2),
    "fp32": Precision("fp32", act_bytes=4, gather_bytes=4, dispatch_bytes=4),
    "fp8-tensorwise": Precision("fp8-tensorwise", act_bytes=2, fp8=True, gather_bytes=1,
                                cast=(4.0, 8.0, 4.0)),
    "fp8-rowwise": Precision("fp8-rowwise", act_bytes=2, fp8=True, gather_bytes=2,
                             cast=(6.0, 10.0, 6.0)),
    "fp8-blockwise": Precision("fp8-blockwise", act_bytes=2, fp8=True, gather_bytes=2,
                               dispatch_bytes=1, cast=(4.0, 6.0, 4.0)),
}
_ALIASES = {"fp8": "fp8-tensorwise", "bfloat16": "bf16", "float32": "fp32"}
PRECISION_NAMES = (*PRECISIONS, *_ALIASES)


def get_precision(name: str) -> Precision:
    key = _ALIASES.get(name, name)
    if key not in PRECISIONS:
        raise PlanInputError("precision", f"must be one of {', '.join(PRECISION_NAMES)}, "
                                          f"got {name!r}")
    return PRECISIONS[key]


def check_supported(precision: Precision, accelerator) -> None:
    """FP8 needs FP8 tensor cores (Hopper, Blackwell); refuse it elsewhere, naming both."""
    if precision.fp8 and not accelerator.peak_fp8_flops:
        raise PlanInputError("precision", f"{precision.name} needs FP8 tensor cores; "
                                          f"{accelerator.name} has none (use bf16)")
