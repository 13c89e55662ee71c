"""What ``aiperf flops FILE`` prints for one graph: a per-layer table and totals, or the same as JSON.

Loading the file (an architecture JSON or a saved Keras model) is the CLI's part (``aiperf.cli``);
this module only formats the counts of a graph it is given.
"""

from __future__ import annotations

import json

from aiperf.families.image.flops import aiperf_compatible_per_image, count_flops, format_table
from aiperf.metrics.score import format_ops
from nas.graph import Graph
from nas.language.spec import TransformerSpec


def flops_report(graph: Graph, name: str, as_json: bool = False, batch_size: int = 128) -> str:
    """The operation counts of ``graph`` (called ``name`` in the output) as text or JSON."""
    cost = count_flops(graph)
    aiperf_eval, aiperf_train = aiperf_compatible_per_image(graph)
    if as_json:
        doc = {
            "architecture": name,
            **cost.to_dict(batch_size),
            "aiperf_compatible": {"eval_per_image": aiperf_eval, "train_per_image": aiperf_train},
        }
        return json.dumps(doc, indent=1)
    title = (
        f"{name}: {len(graph)} nodes, input {'x'.join(map(str, graph.input_shape))}, "
        f"{graph.num_classes} classes (operations per image; docs/flops.md)"
    )
    aiperf_line = (
        f"AIPerf-compatible per image: training {format_ops(aiperf_train, 'ops')}, "
        f"evaluation {format_ops(aiperf_eval, 'ops')}"
    )
    return "\n".join([title, "", format_table(cost, batch_size), aiperf_line])


def transformer_flops_report(spec: TransformerSpec, name: str, as_json: bool = False, batch_size: int = 128) -> str:
    """A language model's operations per token at its context: per block, the head, and the totals.

    ``batch_size`` sequences of ``spec.seq_len`` tokens make one optimizer step, whose AdamW update
    is spread over the step's tokens (docs/flops.md, "Language models"); ``6N`` is the common
    estimate (6 x parameters per token), printed beside the count for comparison.
    """
    from nas.language.flops import transformer_flops

    flops = transformer_flops(spec)
    tokens_per_step = batch_size * spec.seq_len
    blocks = [
        {
            "block": b,
            "qkv": f.qkv,
            "attn_out": f.attn_out,
            "scores": f.scores,
            "weighted_sum": f.weighted_sum,
            "mlp": f.mlp,
            "elementwise": f.elementwise,
            "forward": f.forward(),
        }
        for b, f in enumerate(flops.blocks)
    ]
    totals = {
        "forward_per_token": flops.forward(1),
        "backward_per_token": flops.backward(1),
        "update_per_step": flops.update_per_step,
        "train_per_token": flops.train_per_token(tokens_per_step),
        "six_n_per_token": 6 * spec.params(),
    }
    if as_json:
        head = {"embedding": flops.embedding, "final_norm": flops.final_norm, "output": flops.output}
        loss = {"forward": flops.loss_forward, "backward": flops.loss_backward}
        doc = {
            "architecture": name,
            "params": spec.params(),
            "seq_len": spec.seq_len,
            "batch_size": batch_size,
            "blocks": blocks,
            "head": head,
            "loss": loss,
            **totals,
        }
        return json.dumps(doc, indent=1)
    columns = ("qkv", "attn_out", "scores", "weighted_sum", "mlp", "elementwise", "forward")
    lines = [
        f"{name}: {spec.n_blocks} blocks, width {spec.width}, vocabulary {spec.vocab_size}, context {spec.seq_len},"
        f" {spec.params():,} parameters (operations per token; docs/flops.md, Language models)",
        "",
        "block " + "".join(f"{c:>15}" for c in columns),
    ]
    lines += [f"{row['block']:>5} " + "".join(f"{row[c]:>15,.0f}" for c in columns) for row in blocks]
    lines += [
        f"head: embedding {flops.embedding:,}, final norm {flops.final_norm:,}, output {flops.output:,};"
        f" loss forward {flops.loss_forward:,}, backward {flops.loss_backward:,}",
        f"forward per token {format_ops(totals['forward_per_token'], 'ops')}, backward"
        f" {format_ops(totals['backward_per_token'], 'ops')}; training per token at batch {batch_size}"
        f" ({tokens_per_step:,} tokens a step, the AdamW update's {flops.update_per_step:,} shared)"
        f" {format_ops(totals['train_per_token'], 'ops')}; 6N estimate {format_ops(totals['six_n_per_token'], 'ops')}",
    ]
    return "\n".join(lines)
