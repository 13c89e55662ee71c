"""A small language-model run written as the master writes one: typed records through ``LedgerWriter``.

Its counts are computed here as the master computes them (``nas.language.flops``), not with
the readers under test, so a reader that recounts them checks something.
"""

from __future__ import annotations

import math
from pathlib import Path

from aiperf.ledger.schema import (
    EpochRecord,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialEndRecord,
    TrialFlops,
    TrialHparams,
    TrialStartRecord,
    TrialStatus,
)
from aiperf.ledger.store import LedgerWriter
from aiperf.results.summary import build_summary, save_summary
from nas.language.flops import transformer_flops
from nas.language.spec import TransformerSpec, seed_spec

SEQ_LEN, BATCH, STEPS, EVAL_WINDOWS = 64, 8, 5, 16
BYTES_PER_TOKEN = 1.0  # byte tokens
END_T = 3.0  # the run_stop's t: the duration the score and tokens per second divide by
# Each trial's validation loss per epoch (nats per token): trial t00001 reaches the lowest.
LOSSES = {"t00000": [2.0, 1.6], "t00001": [1.9, 1.2]}


def bits_per_byte(val_loss: float) -> float:
    return val_loss / math.log(2.0) / BYTES_PER_TOKEN


def quality(val_loss: float) -> float:
    """What the worker records as val_acc: 1 - bits_per_byte / 8, in [0, 1]."""
    return min(1.0, max(0.0, 1.0 - bits_per_byte(val_loss) / 8))


def trial_flops(spec: TransformerSpec, seq_len: int = SEQ_LEN, batch: int = BATCH) -> TrialFlops:
    per_token = transformer_flops(spec, seq_len)
    return TrialFlops(
        forward=per_token.forward(1),
        backward=per_token.backward(1),
        update_per_step=per_token.update_per_step,
        train_per_token=per_token.train_per_token(batch * seq_len),
        eval_per_token=per_token.forward(1),
    )


def epoch_tokens() -> tuple[int, int, int, int]:
    """(training sequences, validation windows, training tokens, validation tokens) of one epoch."""
    sequences = STEPS * BATCH
    return sequences, EVAL_WINDOWS, sequences * SEQ_LEN, EVAL_WINDOWS * SEQ_LEN


def language_run(run_dir: Path) -> Path:
    """Two completed trials of the seed transformer, two epochs each, then a completed end; with summary.json."""
    spec = seed_spec()
    flops = trial_flops(spec)
    sequences, windows, train_tokens, eval_tokens = epoch_tokens()
    assert flops.train_per_token is not None and flops.eval_per_token is not None
    train_ops, eval_ops = flops.train_per_token * train_tokens, flops.eval_per_token * eval_tokens
    t = 0.0
    with LedgerWriter(run_dir) as ledger:
        ledger.append(
            RunStartRecord(
                t=t,
                run_id="lm-test",
                family="language",
                config={"run": {"name": "lm-test", "seed": 0}},
                plan={"backend": "jax", "concurrency": 1, "precision": "float32", "batch_size": BATCH,
                      "nodes": [{"node_id": "n0", "hostname": "h0", "cpus": 2, "gpus": 0}]},
                dataset={"name": "tiny-text", "train_tokens": 200_000, "eval_tokens": 20_000, "vocab_size": 256,
                         "tokenizer": "bytes", "bytes_per_token": BYTES_PER_TOKEN,
                         "split": {"method": "contiguous", "seed": 0, "disjoint": True}},
                rules={"min_accuracy": 0.5, "min_precision_bits": 16},
                seed_architecture=spec.to_dict(),
            )
        )  # fmt: skip
        for k, (trial, losses) in enumerate(LOSSES.items()):
            t += 0.1
            ledger.append(
                TrialStartRecord(
                    t=t,
                    trial=trial,
                    kind="seed" if k == 0 else "tune",
                    parent=None if k == 0 else "t00000",
                    arch_id=spec.key(),
                    transformer=spec.to_dict(),
                    hparams=TrialHparams(
                        learning_rate=1e-3,
                        warmup_fraction=0.1,
                        weight_decay=0.01,
                        batch_size=BATCH,
                        seq_len=SEQ_LEN,
                        epochs=len(losses),
                    ),
                    flops=flops,
                    params=spec.params(),
                    worker="w0",
                    node="n0",
                )
            )
            for epoch, loss in enumerate(losses, start=1):
                t += 0.5
                ledger.append(
                    EpochRecord(
                        t=t,
                        trial=trial,
                        epoch=epoch,
                        train_images=sequences,
                        eval_images=windows,
                        train_tokens=train_tokens,
                        eval_tokens=eval_tokens,
                        steps=STEPS,
                        batch_size=BATCH,
                        train_ops=train_ops,
                        eval_ops=eval_ops,
                        ops=train_ops + eval_ops,
                        val_acc=quality(loss),
                        train_loss=loss + 0.1,
                        val_loss=loss,
                        bits_per_byte=bits_per_byte(loss),
                        train_s=0.3,
                        eval_s=0.05,
                        data_wait_s=0.0,
                        input="memory",
                        precision="float32",
                        worker="w0",
                        node="n0",
                    )
                )
            ledger.append(
                TrialEndRecord(
                    t=t,
                    trial=trial,
                    status=TrialStatus.COMPLETED,
                    epochs=len(losses),
                    best_val_acc=max(quality(x) for x in losses),
                    worker="w0",
                )
            )
        ledger.append(RunStopRecord(t=END_T, status=RunStatus.COMPLETED, reason="time budget reached"))
    save_summary(run_dir, build_summary(run_dir))
    return run_dir
