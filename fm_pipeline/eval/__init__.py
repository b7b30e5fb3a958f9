"""Held-out evaluation per data domain: loss and perplexity of a checkpoint (or of the model
at initialisation) on the mix's held-out windows of each source.

    from fm_pipeline.eval import evaluate_checkpoint, evaluate_at_init
    result = evaluate_checkpoint(".fm/runs/demo/checkpoints/step-00000020", site=site, job=job)
    print(result.summary())       # demo step 20: code loss 5.91 ppl 369.5; prose loss ...

    python -m fm_pipeline.eval.worker --checkpoint DIR --out eval.json        # one process
    torchrun --standalone --nproc-per-node 2 -m fm_pipeline.eval.worker ...   # any world size

The model is built and restored with the trainer's and the checkpoint package's own code.
The result is recorded as the checkpoint's `eval` mark (see fm_pipeline.catalog.marks).
"""

from fm_pipeline.eval.result import DomainLoss, EvalResult
from fm_pipeline.eval.run import (
    EvaluationFailed,
    evaluate_at_init,
    evaluate_checkpoint,
    evaluate_checkpoints,
)

__all__ = ["DomainLoss", "EvalResult", "EvaluationFailed", "evaluate_at_init",
           "evaluate_checkpoint", "evaluate_checkpoints"]
