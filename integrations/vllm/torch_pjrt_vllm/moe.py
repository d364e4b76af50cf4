"""Mixture-of-experts layers on pjrt: vLLM leaves an out-of-tree platform's unquantized MoE to
the platform; here it is plain PyTorch, every expert on every token, weighted by the router."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)


# vLLM looks out-of-tree replacements up by class name
@UnquantizedFusedMoEMethod.register_oot(name="UnquantizedFusedMoEMethod")
class PjrtUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Routing (softmax, top-k, renormalized) and the experts in one method (vLLM's routers
    call CUDA kernels), dense over the experts: fixed shapes whatever the routing (one
    program per token bucket), at num_experts / top_k times a grouped kernel's products."""

    @property
    def is_monolithic(self) -> bool:
        return True

    def apply_monolithic(self, layer, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        unsupported = {"expert parallelism": layer.expert_map is not None,
                       "grouped top-k": layer.use_grouped_topk,
                       "a custom routing function": layer.custom_routing_function is not None,
                       "expert score correction": layer.e_score_correction_bias is not None,
                       "router weights on the input": layer.apply_router_weight_on_input,
                       f"scoring {layer.scoring_func}": layer.scoring_func != "softmax",
                       f"activation {layer.activation}": layer.activation != MoEActivation.SILU}
        given = [name for name, present in unsupported.items() if present]
        if given:
            raise NotImplementedError(f"pjrt MoE: {', '.join(given)} not supported yet "
                                      "(softmax top-k routing and SiLU experts are)")
        probs = router_logits.float().softmax(-1)
        weights, ids = probs.topk(layer.top_k, dim=-1)
        if layer.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        routing = torch.zeros_like(probs).scatter(1, ids, weights)  # [tokens, experts]
        if layer.routed_scaling_factor not in (None, 1.0):
            routing = routing * layer.routed_scaling_factor
        w13, w2 = layer.w13_weight, layer.w2_weight  # [E, 2I, H], [E, H, I]
        gate, up = torch.einsum("th,eoh->teo", x, w13).chunk(2, dim=-1)
        down = torch.einsum("tei,ehi->teh", F.silu(gate) * up, w2)
        return (down.float() * routing[..., None]).sum(1).to(x.dtype)
