"""BigDL-style module utilities on torch modules, and the ConvLSTMPeephole reference model.

BigDL's ``AbstractModule`` API, as functions over ``torch.nn.Module``:

==============================  ============================================
BigDL                           here
==============================  ============================================
``loadModelWeights(src, all)``  :func:`load_model_weights` (by layer name)
``loadWeights(path, all)``      :func:`load_weights` (a tensorlist file)
``saveWeights`` / ``saveModule`` :func:`save_weights` / :func:`save_module`
``getParametersTable()``        :func:`parameters_table`
``get/setExtraParameter()``     :func:`get_extra_parameters` / :func:`set_extra_parameters`
``freeze(names)``/``unFreeze``  :func:`freeze` / :func:`unfreeze` (names or globs)
``predict`` / ``predictClass``  :func:`predict` / :func:`predict_class`
``evaluate(data, methods)``     :func:`evaluate` with :class:`Loss`, :class:`Top1Accuracy`
==============================  ============================================

``ConvLSTMPeephole`` (and ``ConvLSTMPeephole3D``) follow BigDL's layer of that
name (Shi et al. 2015, arXiv 1506.04214).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
from typing import Callable, Dict, List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from tensorlist._base import backends
from tensorlist.torch import LoadResult, load_module_state, match_state, save_module_state

__all__ = [
    "load_model_weights", "load_weights", "save_weights", "save_module", "parameters_table",
    "get_extra_parameters", "set_extra_parameters", "freeze", "unfreeze", "predict", "predict_class",
    "evaluate", "Loss", "Top1Accuracy", "ValidationResult", "ConvLSTMPeepholeCell", "ConvLSTMPeephole",
    "ConvLSTMPeephole3D",
]


# --------------------------------------------------------------------------
# weights


def _layer_tensors(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``layer.tensor`` -> each layer's own (non-recursive) parameters and buffers, in module order."""
    out = {}
    for name, m in module.named_modules():
        own = dict(m.named_parameters(recurse=False))
        own.update({k: b for k, b in m.named_buffers(recurse=False) if b is not None})
        for t, v in own.items():
            out[f"{name}.{t}" if name else t] = v
    return out


def load_model_weights(dst: torch.nn.Module, src: torch.nn.Module, match_all: bool = True) -> LoadResult:
    """Copies weights from ``src`` into ``dst`` layer by layer, matching layers by name (BigDL's ``loadModelWeights``).

    Args:
        dst: the module to fill.
        src: the module to copy from.
        match_all: every layer of ``dst`` with weights must exist in ``src``
            with the same tensors and shapes, else ``ValueError`` and nothing
            is copied. False: copy the layers that match, report the rest.

    Returns:
        A :class:`tensorlist.torch.LoadResult` with ``layer.tensor`` names.

    Example:
        >>> a, b = torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> load_model_weights(b, a).complete and torch.equal(a[0].weight, b[0].weight)
        True
    """
    own, theirs = _layer_tensors(dst), _layer_tensors(src)
    result = match_state(own, theirs)
    if match_all and (result.missing or result.mismatched):
        raise ValueError(f"load_model_weights(match_all=True): layers do not match: {result.summary()}")
    with torch.no_grad():
        for key in result.loaded:
            own[key].copy_(theirs[key])
    if not result.complete:
        import logging

        logging.getLogger("tensorlist.loops.nn").warning("load_model_weights: partial copy: %s", result.summary())
    return result


def load_weights(module: torch.nn.Module, path, match_all: bool = True, *, device=None) -> LoadResult:
    """Loads weights from a tensorlist file (BigDL's ``loadWeights(path, matchAll)``): strict by default."""
    return load_module_state(path, module, strict=match_all, device=device)


def save_weights(module: torch.nn.Module, path, overwrite: bool = False, **kwargs) -> None:
    """Saves parameters and buffers to a tensorlist file (BigDL's ``saveWeights``); see :func:`save_module`."""
    save_module(module, path, overwrite=overwrite, **kwargs)


def save_module(module: torch.nn.Module, path, overwrite: bool = False, *, training=None, dataset_params=None,
                metadata=None, **save_options) -> None:
    """Saves a module's state to a local path or any URL ``tensorlist.save`` takes (``s3://``, ``memory://``...).

    With ``training=`` and ``dataset_params=`` the file is a model file
    carrying both records. The module's class is recorded in the metadata
    (``module``) for information; loading needs the class in code, as in torch.

    Raises:
        FileExistsError: ``path`` exists (local paths) and ``overwrite`` is False.
    """
    p = os.fspath(path)
    if not overwrite and not backends.is_remote(p) and os.path.exists(backends.localize(p)):
        raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
    meta = dict(metadata or {})
    meta.setdefault("module", f"{type(module).__module__}.{type(module).__qualname__}")
    save_module_state(p, module, training=training, dataset_params=dataset_params, metadata=meta, **save_options)


def parameters_table(module: torch.nn.Module) -> Dict[str, Dict[str, torch.Tensor]]:
    """BigDL's ``getParametersTable``: layer name -> parameter name -> tensor (layers with parameters).

    Example:
        >>> t = parameters_table(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()))
        >>> {k: sorted(v) for k, v in t.items()}
        {'0': ['bias', 'weight']}
    """
    out = {}
    for name, m in module.named_modules():
        own = dict(m.named_parameters(recurse=False))
        if own:
            out[name] = own
    return out


def get_extra_parameters(module: torch.nn.Module) -> List[torch.Tensor]:
    """BigDL's ``getExtraParameter``: the floating-point buffers (running mean/var...), in module order."""
    return [b for b in module.buffers() if b.is_floating_point()]


def set_extra_parameters(module: torch.nn.Module, values: Sequence[torch.Tensor]) -> torch.nn.Module:
    """BigDL's ``setExtraParameter``: copies ``values`` into :func:`get_extra_parameters`'s buffers, in order.

    Raises:
        ValueError: a different count or a shape mismatch (nothing copied).
    """
    own = get_extra_parameters(module)
    if len(own) != len(values):
        raise ValueError(f"set_extra_parameters: the module has {len(own)} extra parameters, got {len(values)}")
    for i, (b, v) in enumerate(zip(own, values)):
        if tuple(b.shape) != tuple(v.shape):
            raise ValueError(f"set_extra_parameters: extra parameter {i} has shape {list(b.shape)}, got {list(v.shape)}")
    with torch.no_grad():
        for b, v in zip(own, values):
            b.copy_(v)
    return module


def _select(module: torch.nn.Module, names) -> List[torch.nn.Parameter]:
    if names is None or (not isinstance(names, str) and len(names) == 0):
        return list(module.parameters())
    patterns = [names] if isinstance(names, str) else list(names)
    chosen, used = {}, set()
    for mname, m in module.named_modules():
        for pat in patterns:
            if mname and fnmatch.fnmatchcase(mname, pat):
                used.add(pat)
                for p in m.parameters():
                    chosen[id(p)] = p
    for pname, p in module.named_parameters():
        for pat in patterns:
            if fnmatch.fnmatchcase(pname, pat):
                used.add(pat)
                chosen[id(p)] = p
    unknown = [p for p in patterns if p not in used]
    if unknown:
        raise KeyError(f"no layer or parameter matches {unknown}")
    return list(chosen.values())


def freeze(module: torch.nn.Module, names: Union[None, str, Sequence[str]] = None) -> torch.nn.Module:
    """BigDL's ``freeze``: stop training the parameters of the named layers (names or globs; none: all).

    Names match layer names (``"encoder.0"``, ``"encoder.*"``) or parameter
    names (``"*.bias"``). An unknown name is a ``KeyError``.
    """
    for p in _select(module, names):
        p.requires_grad_(False)
    return module


def unfreeze(module: torch.nn.Module, names: Union[None, str, Sequence[str]] = None) -> torch.nn.Module:
    """BigDL's ``unFreeze``: train the named layers' parameters again (none: all)."""
    for p in _select(module, names):
        p.requires_grad_(True)
    return module


# --------------------------------------------------------------------------
# predict and evaluate


def _batches(data, batch_size: int):
    if isinstance(data, torch.utils.data.DataLoader):
        yield from data
        return
    if isinstance(data, (tuple, list)) and data and all(isinstance(t, torch.Tensor) for t in data):
        n = len(data[0])
        for i in range(0, n, batch_size):
            yield tuple(t[i:i + batch_size] for t in data) if len(data) > 1 else data[0][i:i + batch_size]
        return
    if isinstance(data, torch.Tensor):
        for i in range(0, len(data), batch_size):
            yield data[i:i + batch_size]
        return
    yield from torch.utils.data.DataLoader(data, batch_size=batch_size)


def _input(batch):
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def predict(module: torch.nn.Module, data, batch_size: int = 32, *, device=None) -> torch.Tensor:
    """Outputs of ``module`` over ``data`` in eval mode, batch by batch, concatenated.

    ``data``: a tensor of inputs, a tuple ``(inputs, targets)`` of tensors, a
    Dataset of ``(input, target)`` or inputs, or a DataLoader.
    """
    was = module.training
    module.eval()
    outs = []
    try:
        with torch.no_grad():
            for batch in _batches(data, batch_size):
                x = _input(batch)
                outs.append(module(x.to(device) if device is not None else x))
    finally:
        module.train(was)
    return torch.cat(outs) if outs else torch.empty(0)


def predict_class(module: torch.nn.Module, data, batch_size: int = 32, *, device=None) -> torch.Tensor:
    """The predicted class (argmax over dimension 1) of each example (0-based, unlike BigDL's 1-based)."""
    return predict(module, data, batch_size, device=device).argmax(dim=1)


@dataclasses.dataclass(frozen=True)
class ValidationResult:
    """A validation method's result: ``value`` over ``count`` examples."""

    value: float
    count: int


class Loss:
    """The mean of ``loss_fn(output, target)`` over examples (weighted by batch size)."""

    def __init__(self, loss_fn: Callable = F.cross_entropy, name: str = "Loss"):
        self.loss_fn, self.name = loss_fn, name

    def __call__(self, output, target) -> Tuple[float, int]:
        n = int(target.shape[0])
        return float(self.loss_fn(output, target)) * n, n


class Top1Accuracy:
    """The fraction of examples whose argmax output equals the target class."""

    name = "Top1Accuracy"

    def __call__(self, output, target) -> Tuple[float, int]:
        return float((output.argmax(dim=1) == target).sum()), int(target.shape[0])


def evaluate(module: torch.nn.Module, data, methods: Sequence = (Top1Accuracy(),), batch_size: int = 32, *,
             device=None) -> Dict[str, ValidationResult]:
    """BigDL's ``evaluate(dataset, vMethods)``: each method's value over ``data`` (batches of ``(input, target)``).

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> with torch.no_grad(): _ = m.weight.copy_(torch.eye(2)); _ = m.bias.zero_()
        >>> x = torch.tensor([[1., 0.], [0., 1.], [1., 0.]]); y = torch.tensor([0, 1, 1])
        >>> evaluate(m, (x, y), [Top1Accuracy()])["Top1Accuracy"]
        ValidationResult(value=0.6666666666666666, count=3)
    """
    was = module.training
    module.eval()
    sums = {getattr(m, "name", type(m).__name__): [0.0, 0] for m in methods}
    try:
        with torch.no_grad():
            for batch in _batches(data, batch_size):
                x, y = batch[0], batch[1]
                if device is not None:
                    x, y = x.to(device), y.to(device)
                out = module(x)
                for m in methods:
                    v, n = m(out, y)
                    acc = sums[getattr(m, "name", type(m).__name__)]
                    acc[0] += v
                    acc[1] += n
    finally:
        module.train(was)
    return {k: ValidationResult(v / n if n else float("nan"), n) for k, (v, n) in sums.items()}


# --------------------------------------------------------------------------
# ConvLSTMPeephole


class ConvLSTMPeepholeCell(torch.nn.Module):
    """One step of a convolutional LSTM with peephole connections (Shi et al. 2015, BigDL's cell).

    With ``*`` a convolution and ``∘`` the Hadamard product::

        i = σ(W_xi * x + W_hi * h + w_ci ∘ c + b_i)
        f = σ(W_xf * x + W_hf * h + w_cf ∘ c + b_f)
        c' = f ∘ c + i ∘ tanh(W_xc * x + W_hc * h + b_c)
        o = σ(W_xo * x + W_ho * h + w_co ∘ c' + b_o)
        h' = o ∘ tanh(c')

    The peephole weights ``w_c*`` are per output plane (shape
    ``[output_size, 1, 1]``), as BigDL's ``CMul``. Gates are ordered i, f, c,
    o in the convolutions' output channels. ``forward(x, (h, c))`` returns
    ``(h', (h', c'))``: BigDL's ``T(output, hiddens)``.
    """

    def __init__(self, input_size: int, output_size: int, kernel_i: int, kernel_c: int, stride: int = 1,
                 padding: int = -1, with_peephole: bool = True, dims: int = 2):
        super().__init__()
        if dims not in (2, 3):
            raise ValueError(f"dims must be 2 or 3, got {dims!r}")
        if stride == -1:  # BigDL's documented "stride -1": SAME padding, unit step
            stride, padding = 1, -1
        if stride < 1:
            raise ValueError(f"stride must be >= 1 (or -1), got {stride!r}")
        conv = torch.nn.Conv2d if dims == 2 else torch.nn.Conv3d
        self.input_size, self.output_size, self.dims = input_size, output_size, dims
        self.kernel_i, self.kernel_c, self.stride, self.with_peephole = kernel_i, kernel_c, stride, with_peephole
        pad_i = (kernel_i - 1) // 2 if padding == -1 else padding
        if padding == -1 and stride == 1:
            pad_i = "same"  # exact SAME padding, even kernels included
        self.conv_x = conv(input_size, 4 * output_size, kernel_i, stride=stride, padding=pad_i)
        self.conv_h = conv(output_size, 4 * output_size, kernel_c, stride=1, padding="same", bias=False)
        shape = (output_size,) + (1,) * dims
        if with_peephole:
            self.w_ci = torch.nn.Parameter(torch.zeros(shape))
            self.w_cf = torch.nn.Parameter(torch.zeros(shape))
            self.w_co = torch.nn.Parameter(torch.zeros(shape))
            torch.nn.init.uniform_(self.w_ci, -0.1, 0.1)
            torch.nn.init.uniform_(self.w_cf, -0.1, 0.1)
            torch.nn.init.uniform_(self.w_co, -0.1, 0.1)

    def hidden_shape(self, x: torch.Tensor) -> Tuple[int, ...]:
        """The shape of ``h`` and ``c`` for an input step ``x`` of shape ``[batch, planes, *spatial]``."""
        with torch.no_grad():
            spatial = self.conv_x(x[:1, :, ...].new_zeros((1,) + tuple(x.shape[1:]))).shape[2:]
        return (x.shape[0], self.output_size) + tuple(spatial)

    def forward(self, x, hidden=None):
        if hidden is None:
            shape = self.hidden_shape(x)
            hidden = (x.new_zeros(shape), x.new_zeros(shape))
        h, c = hidden
        gi, gf, gc, go = (self.conv_x(x) + self.conv_h(h)).chunk(4, dim=1)
        if self.with_peephole:
            gi = gi + self.w_ci * c
            gf = gf + self.w_cf * c
        c2 = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gc)
        if self.with_peephole:
            go = go + self.w_co * c2
        h2 = torch.sigmoid(go) * torch.tanh(c2)
        return h2, (h2, c2)


class ConvLSTMPeephole(torch.nn.Module):
    """A 2-D convolutional LSTM with peepholes over a sequence (BigDL's ``ConvLSTMPeephole`` in ``Recurrent``).

    Args:
        input_size: input planes.
        output_size: output planes.
        kernel_i: filter size convolving the input.
        kernel_c: filter size convolving the cell (hidden) state.
        stride: step of the input convolution; -1 (BigDL's documented
            default) means step 1 with SAME padding, so the output's spatial
            shape equals the input's.
        padding: padding of the input convolution; -1: SAME.
        with_peephole: peephole connections from the cell to the gates.

    ``forward(x)`` takes ``[batch, time, planes, height, width]`` and returns
    ``[batch, time, output_size, height', width']`` (every step's ``h``); the
    last state is kept in ``self.last_state``. The step is ``self.cell``.

    Example:
        >>> m = ConvLSTMPeephole(3, 4, kernel_i=3, kernel_c=3, stride=-1)
        >>> m(torch.zeros(2, 5, 3, 8, 8)).shape
        torch.Size([2, 5, 4, 8, 8])
    """

    dims = 2

    def __init__(self, input_size: int, output_size: int, kernel_i: int, kernel_c: int, stride: int = 1,
                 padding: int = -1, with_peephole: bool = True):
        super().__init__()
        self.cell = ConvLSTMPeepholeCell(input_size, output_size, kernel_i, kernel_c, stride, padding,
                                         with_peephole, dims=self.dims)
        self.last_state = None

    def forward(self, x: torch.Tensor, hidden=None) -> torch.Tensor:
        if x.dim() != self.dims + 3:
            raise ValueError(f"{type(self).__name__} expects [batch, time, planes, {'x'.join(['spatial'] * self.dims)}]"
                             f" ({self.dims + 3} dimensions), got shape {list(x.shape)}")
        outs = []
        for t in range(x.shape[1]):
            h, hidden = self.cell(x[:, t], hidden)
            outs.append(h)
        self.last_state = hidden
        return torch.stack(outs, dim=1)


class ConvLSTMPeephole3D(ConvLSTMPeephole):
    """The 3-D variant (BigDL's ``ConvLSTMPeephole3D``): input ``[batch, time, planes, depth, height, width]``."""

    dims = 3
