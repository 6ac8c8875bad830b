"""The built-in fusion patterns, declarative rules of the SDK's rewrite engine (:mod:`ge_sdk.rewrite`),
by family: :mod:`.weights` (folds into Conv/Gemm weights), :mod:`.activations` (GELU, SiLU,
rotary; the activations an epilogue takes), :mod:`.norms` (LayerNorm, RMSNorm, Softmax),
:mod:`.attention` (attention and its heads' layout), :mod:`.epilogues` (bias, residual and
activation fused into Conv and MatMul/Gemm).

Each rule has a name the fusion switch file can turn off. They run in phases (see
:data:`PHASES`): weight folds first (so the epilogue fusions see bare convolutions), then the
recognition of decomposed activations and normalisations, attention, the Transposes around
attention's heads folded into it, the epilogues (bias, residual, activation) fused into Conv and
MatMul/Gemm, and last ONNX's own Softmax and LayerNormalization handed to the fused row kernels.
"""

from __future__ import annotations

from ge_sdk.rewrite import Rule, RuleSet

from .activations import ACTIVATIONS, activation_steps, gelu_rules, rotary_rule, silu_rule
from .attention import attention_layout_rule, attention_rule
from .epilogues import conv_epilogue_rules, matmul_rules
from .norms import layernorm_rule, onnx_layernorm_rule, onnx_softmax_rule, rmsnorm_rule, softmax_rule
from .weights import fold_rules

__all__ = ["ACTIVATIONS", "PHASES", "RULES", "RULE_SETS", "activation_steps"]


def _build() -> list[tuple[str, list[Rule]]]:
    gelu, gelu_tanh = gelu_rules()
    recognise = [gelu, gelu_tanh, silu_rule(), layernorm_rule(), rmsnorm_rule(), softmax_rule(), rotary_rule()]
    conv_act, conv_res = conv_epilogue_rules()
    matmul, gemm_act, gemm_res = matmul_rules()
    return [("fold", fold_rules()), ("recognise", recognise), ("attention", [attention_rule()]),
            ("layout", [attention_layout_rule()]),
            ("epilogue", [conv_act, conv_res, matmul, gemm_act, gemm_res]),
            ("kernels", [onnx_softmax_rule(), onnx_layernorm_rule()])]


#: (phase, rules) in the order they run.
PHASES: list[tuple[str, list[Rule]]] = _build()

#: The phases as rule sets (rule priority within a phase), applied one after the other by the
#: driver to the graph and every If/Loop/Scan body in it.
RULE_SETS: list[RuleSet] = [RuleSet(rules, name=phase) for phase, rules in PHASES]

#: Every built-in rule by name.
RULES: dict[str, Rule] = {r.name: r for _, rules in PHASES for r in rules}
