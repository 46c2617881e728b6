"""The reference training loops (lamp's ``IOLoops``) on torch, with tensorlist checkpoints.

    >>> import torch, tensorlist.loops as loops
    >>> torch.manual_seed(0) and None
    >>> x = torch.randn(64, 3); y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> res = loops.epochs(model, opt, loops.Minibatches(x, y, 16), loss_fn=torch.nn.functional.mse_loss,
    ...                    max_epochs=5, validation=[(x, y)], progress=False)
    >>> len(res.learning_curve), res.learning_curve[-1][1] < res.learning_curve[0][1]
    (5, True)

The package, one concept per module (each may import only the ones listed before it):
``schedules`` (learning-rate and SWA schedules), ``state`` (State, Events,
RNG states), ``batches`` (steps, batch streams, Minibatches), ``checkpoint``
(the checkpoint document, written atomically, read once; reading a sharded
checkpoint's loop state), ``config`` (the loops' shared parameters),
``sharded`` (sharded checkpoints through torch.distributed.checkpoint, imported
by ``run`` only for a run that uses them), ``run`` (an epoch, the epoch tail,
resume, model files), ``train`` (the three loops); ``demo`` uses the facade.
This facade re-exports the public names. See ``docs/LOOPS.md``.
"""
from tensorlist.loops.schedules import ConstantSWA, CyclicSWA, Decrement, Noop, ReduceLROnPlateau
from tensorlist.loops.checkpoint import LOOP_STATE_FORMAT, read_checkpoint
from tensorlist.loops.state import Events, State
from tensorlist.loops.train import LoopResult, Minibatches, TrainingLoopContext, epochs, supervised_step, swa_epochs, with_swa

__all__ = [
    "epochs", "swa_epochs", "with_swa", "supervised_step", "Minibatches", "TrainingLoopContext", "LoopResult",
    "State", "Events", "read_checkpoint", "LOOP_STATE_FORMAT",
    "Noop", "Decrement", "ReduceLROnPlateau", "ConstantSWA", "CyclicSWA",
]
