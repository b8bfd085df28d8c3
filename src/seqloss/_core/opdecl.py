"""One op declaration: what an op is, from which its ``torch.library`` op, autograd and
call ladder are made.

Every loss-like op here computes its gradient in the forward pass (function merging, as
torchaudio does): its implementation takes the differentiable tensors first, then the
rest of its arguments ending with ``(..., compute_grad, validate)``, and returns
``(value, *grads)``, one gradient per differentiable tensor, each with the value's
batch axis at ``batch_dim``. The backward only scales the saved gradients by the
incoming per-batch gradient (``grads_to_hand_on``). ``OpDecl`` turns that description
into:

- the registered op (``decl.op``: fake kernel, autograd formula), used while tracing
  (``torch.compile``, fake and functional tensors);
- the eager path: the same implementation behind one shared ``autograd.Function``
  (the library's Python dispatch costs ~30 us a call, most of a small batch's budget);
- ``torch.func`` support (grad, vjp, jacrev) through its ``setup_context`` twin;
- the call ladder choosing between them (``decl(*args)``), and ``decl.value(*args)``,
  which tries the declared eager fast path first and returns the value alone.

A fast path (a "lane") is ``fast(*args) -> (value, *grads) or None``, called with the
op's own (converted, resolved-backend) arguments in eager mode only: the implementation's
results (only ``value`` counts without ``compute_grad``), or ``None`` to take the general
path. The declaration hands them on through one lean ``autograd.Function`` shared by
every lane (``_Lane``: one output, the gradients kept on ``ctx``), with ``_EagerOp``'s
backward rule and autograd semantics.

An op whose gradient depends on the incoming one (``logmmexp``) declares a ``vjp``
instead: its implementation returns ``(value, *saved)`` (intermediates the backward
reuses, never differentiated) and ``vjp`` computes the inputs' gradients from them;
the declaration makes its autograd formula, its eager and ``torch.func`` Functions and
the double-backward error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from . import torch_compat as tc
from .lanes import attach, freed_graph, scaled_grads
from .ops import _all_ones, _keep_graph, apply_eagerly, batch_product, c_apply, grads_to_hand_on

_wrapped = tc.is_functorch_wrapped
_is_functional = tc.is_functional_tensor
_compiling = torch.compiler.is_compiling
_transforms_active = tc.functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_TRACED = tc.TRACED_TENSORS


class OpDecl:
    """A loss-like op: ``impl(*diff, *rest) -> (value, *grads)``; ``rest`` ends with
    ``(compute_grad, validate)``.

    Args:
        name: the op's qualified name (``"seqloss::rnnt_loss"``).
        impl: the implementation (type-annotated: its annotations are the schema).
        fake: the fake kernel, same arguments.
        n_diff: how many leading tensors are differentiable; 0: a plain op (no autograd,
            no ``compute_grad``), the registered op while compiling, ``impl`` otherwise.
        batch_dim: the batch axis of every gradient.
        batch_scale: ``(grad_value, grads, scale_args) -> per-slice factor`` along
            ``batch_dim``, for gradients whose batch axis is not the value's (a packed
            layout); ``scale_args`` are the ``rest`` arguments at ``scale_args``.
        scale_args: consecutive indices into ``rest`` of the tensors ``batch_scale`` reads.
        fast: an eager CPU fast path, a lane (see the module docstring; not with ``vjp``).
        per_backend: ``backend name -> implementation`` for the backends whose kernel does
            more than ``impl`` asks of a backend (checks the values, applies the NaN
            policy, reduces): what a backend can do, declared where the call is
            dispatched; same arguments as ``impl``, whose ``rest`` then ends with
            ``(backend, compute_grad, validate)``; ``impl`` serves the other backends.
        vjp: ``(grad_value, xs, outputs, rest, needs, traced) -> grads`` (``None``
            where ``needs`` is false) for an op whose outputs are ``(value, *saved)``;
            ``traced``: call the registered backward op, not its implementation.
            ``rest`` holds no tensor then, and ends with ``compute_grad``.
    """

    def __init__(self, name: str, impl: Callable, fake: Callable, *, n_diff: int = 1,
                 batch_dim: int = 0, batch_scale: Callable | None = None,
                 scale_args: tuple[int, ...] = (), fast: Callable | None = None,
                 vjp: Callable | None = None,
                 per_backend: dict[str, Callable] | None = None) -> None:
        self.name = name.split("::")[-1]
        if fast is not None and (vjp is not None or n_diff == 0 or batch_scale is not None):
            raise ValueError(f"{name}: a fast path needs a loss-like op (no vjp, n_diff > 0) "
                             "whose gradients share the value's batch axis (no batch_scale)")
        schema = None
        if per_backend:
            if vjp is not None or n_diff == 0:
                raise ValueError(f"{name}: per_backend needs a loss-like op (no vjp, n_diff > 0)")
            schema = tc.infer_schema(impl, mutates_args=())
            impl = _by_backend(dict(per_backend), impl)
        self.impl, self.n_diff, self.batch_dim = impl, n_diff, batch_dim
        self.batch_scale, self.scale_args, self.fast = batch_scale, scale_args, fast
        lo = scale_args[0] if scale_args else 0
        if tuple(scale_args) != tuple(range(lo, lo + len(scale_args))):
            raise ValueError(f"{name}: scale_args must be consecutive, got {scale_args}")
        self._extra = slice(lo, lo + len(scale_args))  # a slice: ~0.5 us less than a tuple
        self.vjp = vjp
        # Where compute_grad is among the arguments, and the Functions the ladder uses.
        self._flag, self._eager, self._eager_apply, self._func = (
            (-2, _EagerOp, _eager_apply, _FuncOp) if vjp is None
            else (-1, _EagerVjp, _eager_vjp_apply, _FuncVjp))
        op = tc.custom_op(name, impl, mutates_args=(), schema=schema)
        op.register_fake(fake)
        if n_diff == 0:
            pass
        elif vjp is None:
            op.register_autograd(self._op_backward, setup_context=self._op_setup)
        else:
            op.register_autograd(self._vjp_op_backward, setup_context=self._vjp_op_setup)
        self.op = op

    # ------------------------------------------------------------------ autograd
    def _op_setup(self, ctx, inputs, output) -> None:
        rest = inputs[self.n_diff:]
        self._setup(ctx, rest, output)
        ctx.n_rest = len(rest)

    def _setup(self, ctx, rest, output) -> None:
        # The gradient outputs get no incoming gradient: no grads-sized zeros for them.
        ctx.set_materialize_grads(False)
        ctx.decl, ctx.compute_grad, ctx.validate, ctx.extra = self, rest[-2], rest[-1], None
        ctx.save_for_backward(*output[1:], *rest[self._extra])

    def _op_backward(self, ctx, grad_value, *_grad_grads):
        return (*self.hand_on(ctx, grad_value), *(None,) * ctx.n_rest)

    def hand_on(self, ctx, grad_value: Tensor | None) -> tuple[Tensor | None, ...]:
        """The gradients of the differentiable inputs: the saved ones times the incoming."""
        n = self.n_diff
        if grad_value is None:  # only the (non-differentiable) gradient outputs were used
            return (None,) * n
        if ctx.extra is None and not ctx.compute_grad:  # (eagerly it is always True)
            raise RuntimeError(f"seqloss: {self.name} was called with compute_grad=False")
        saved = ctx.saved_tensors
        grads = saved[:n]
        scale = None
        if self.batch_scale is not None:
            extra = saved[n:] if ctx.extra is None else ctx.extra

            def scale(g: Tensor) -> Tensor:
                return self.batch_scale(g, grads, extra)

        if _wrapped(grad_value):  # a torch.func transform: the plain product
            g = grad_value if scale is None else scale(grad_value)
            return tuple(batch_product(x, g, self.batch_dim) for x in grads)
        return grads_to_hand_on(grads, grad_value, self.batch_dim, ctx.validate, scale)

    def _vjp_op_setup(self, ctx, inputs, output) -> None:
        n = self.n_diff
        ctx.set_materialize_grads(False)
        ctx.rest = inputs[n:]
        ctx.save_for_backward(*inputs[:n], *output)

    def _vjp_op_backward(self, ctx, *grads):
        g = grads[0]
        if isinstance(g, (list, tuple)):  # a list output's gradients arrive as one list
            g = g[0]
        n, nones = self.n_diff, (None,) * len(ctx.rest)
        if g is None:
            return (None,) * n + nones
        saved = ctx.saved_tensors
        return (*self.vjp(g, saved[:n], saved[n:], ctx.rest, ctx.needs_input_grad[:n], True),
                *nones)

    def eager_vjp(self, ctx, g: Tensor | None) -> tuple[Tensor | None, ...]:
        """The eager and ``torch.func`` backward of a ``vjp`` op: its implementation, the
        results attached to their inputs under ``create_graph`` (a second backward
        raises)."""
        n = self.n_diff
        if g is None:
            return (None,) * n
        saved = ctx.saved_tensors
        xs = saved[:n]
        with torch.no_grad():
            out = self.vjp(g, xs, saved[n:], ctx.rest, ctx.needs_input_grad[1:n + 1], False)
        if torch.is_grad_enabled():
            msg = f"seqloss: double backward of {self.name} is not supported"
            out = tuple(None if o is None else attach(x, o, msg)
                        for x, o in zip(xs, out, strict=True))
        return out

    # ------------------------------------------------------------------ calls
    def _traced(self, args) -> int:
        """0 eagerly; 1 under a ``torch.func`` transform; 2 while tracing."""
        if _compiling():
            return 2
        xs = args[:self.n_diff]
        for x in xs:
            if _wrapped(x):
                return 1
        for x in xs:
            if isinstance(x, _TRACED) or _is_functional(x):
                return 2
        return 0

    def __call__(self, *args) -> tuple[Tensor, ...]:
        """``(value, *grads)``: the registered op while tracing, the ``torch.func`` Function
        under a transform, the eager ``autograd.Function`` otherwise."""
        if not self.n_diff:  # a plain op: the implementation runs even on fake tensors
            return self.op(*args) if _compiling() else self.impl(*args)
        return self._call(self._traced(args), args)

    def _call(self, how: int, args: tuple) -> tuple[Tensor, ...]:
        n = self.n_diff
        if how == 2:
            return self.op(*args)
        if how == 1:
            return self._func.apply((self, args[n:]), *args[:n])
        if not args[self._flag]:  # no gradient wanted: no autograd wrapper either
            return self.impl(*args)
        out = apply_eagerly(self._eager, self._eager_apply, (self, args[n:]), *args[:n])
        return out if self.vjp is None else (out,)

    def value(self, *args) -> Tensor:
        """The value alone; eagerly through the fast path when one is declared and takes
        the call (a caller may call ``fast`` itself where ``eager`` holds, as this does)."""
        n = self.n_diff
        xs = args[:n]
        if not _compiling():
            for x in xs:
                if _wrapped(x) or isinstance(x, _TRACED) or _is_functional(x):
                    break
            else:  # eager
                fast = self.fast
                if fast is not None and not _transforms_active():
                    out = fast(*args)
                    if out is not None:
                        if not args[-2]:
                            return out[0]
                        return apply_lane((self, out, args[-1]), *xs)
                if not args[self._flag]:
                    return self.impl(*args)[0]
                out = apply_eagerly(self._eager, self._eager_apply, (self, args[n:]), *xs)
                return out[0] if self.vjp is None else out
        return self(*args)[0]


def eager(x: Tensor) -> bool:
    """Whether ``value`` calls the fast hook for an op whose one differentiable input ``x``
    is an exact ``Tensor`` (traced tensors are subclasses): no tracing, no ``torch.func``
    transform. For a caller whose own exact-type test already passed, so that it calls
    the hook directly (and hands its results on as ``value`` does, through ``apply_lane``):
    ``value``'s tests and argument tuples cost ~1.5 us, 5% of a small CTC forward+backward."""
    return not (_compiling() or _transforms_active() or _wrapped(x) or _is_functional(x))


def _by_backend(table: dict[str, Callable], default: Callable) -> Callable:
    """One implementation choosing ``table[backend]`` (``default`` for the others)."""

    def impl(*args):
        return table.get(args[-3], default)(*args)

    return impl


class _EagerOp(torch.autograd.Function):
    """Every declared op in eager mode. The old-style ``forward(ctx, ...)``:
    ``setup_context`` costs an ``inspect.signature`` per call, so only the ``torch.func``
    twin has one. Everything but the differentiable inputs travels in one tuple
    (``apply`` costs ~0.5 us per argument). The gradient outputs stay "differentiable"
    on purpose: saved and unpacked, they are attached to this node, so under
    ``create_graph`` the product through ``scale_grad`` is too, and a double backward
    meets its clear error."""

    @staticmethod
    def forward(ctx, spec, *xs):
        decl, rest = spec
        out = decl.impl(*xs, *rest)
        ctx.set_materialize_grads(False)
        # The scaling's inputs on ctx: they are not the Function's, so no reference cycle,
        # and a tuple there is ~1 us cheaper than saving them.
        ctx.decl, ctx.validate = decl, rest[-1]
        ctx.extra = rest[decl._extra]
        ctx.save_for_backward(*out[1:])
        return out

    @staticmethod
    def backward(ctx, grad_value, *_grad_grads):
        return (None, *ctx.decl.hand_on(ctx, grad_value))


_eager_apply = c_apply(_EagerOp)


class _Lane(torch.autograd.Function):
    """Every fast path's eager ``autograd.Function``: ``_EagerOp``'s backward rule
    (``grads_to_hand_on``) and semantics, for a kernel already run (``spec``: the
    declaration, the path's ``(value, *grads)`` and ``validate``). One output and the
    gradients kept on ``ctx``: two outputs, ``save_for_backward`` and a detached alias
    cost ~1.5 us a call, 4% of a B=1 CTC forward+backward. ``ctx`` holds the inputs, to
    attach a ``create_graph`` gradient to, but not the value (a reference cycle)."""

    @staticmethod
    def forward(ctx, spec, *xs):
        decl, out, validate = spec
        ctx.lane = (out[1:], validate, xs, decl)
        return out[0]

    @staticmethod
    def backward(ctx, g):
        lane = ctx.lane
        if lane is None:  # unpacking freed saved tensors would raise this
            raise freed_graph()
        grads, validate, xs, decl = lane
        keep = _keep_graph()
        # The usual loss.backward() of a reduced loss: hand the gradients on as they are
        # (grads_to_hand_on's rule, whose other cases scaled_grads follows).
        if (not keep and type(g) is Tensor and not _grad_enabled() and validate
                and not _compiling() and not _wrapped(g)
                and (g.item() == 1 if g.dim() == 0 else _all_ones(g))):
            ctx.lane = None
            return (None,) + grads
        out = scaled_grads(grads, xs, g, decl.batch_dim, validate)
        if not keep:
            ctx.lane = None
        return (None,) + out


# ``apply_lane((decl, out, validate), *xs)``: the lane's value, attached to ``xs``, for
# ``decl``'s fast path results ``out`` (a caller that called ``fast`` itself, as
# ``eager`` describes, hands them on with it where ``compute_grad`` holds).
apply_lane = c_apply(_Lane)


class _FuncOp(torch.autograd.Function):
    """``_EagerOp`` for ``torch.func`` transforms (grad, vjp, jacrev), which need
    ``setup_context``; ``vmap`` and ``jvp`` are not supported."""

    @staticmethod
    def forward(spec, *xs):
        return spec[0].impl(*xs, *spec[1])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        decl, rest = inputs[0]
        decl._setup(ctx, rest, output)

    backward = _EagerOp.backward


class _EagerVjp(torch.autograd.Function):
    """A ``vjp`` op in eager mode: one output (the value), the intermediates saved."""

    @staticmethod
    def forward(ctx, spec, *xs):
        decl, rest = spec
        out = decl.impl(*xs, *rest)
        ctx.decl, ctx.rest = decl, rest
        ctx.save_for_backward(*xs, *out)
        return out[0]

    @staticmethod
    def backward(ctx, g):
        return (None, *ctx.decl.eager_vjp(ctx, g))


_eager_vjp_apply = c_apply(_EagerVjp)


class _FuncVjp(torch.autograd.Function):
    """``_EagerVjp`` for ``torch.func`` transforms, which need ``setup_context``: the
    intermediates are extra, non-differentiable outputs."""

    @staticmethod
    def forward(spec, *xs):
        return tuple(spec[0].impl(*xs, *spec[1]))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.decl, ctx.rest = inputs[0]
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*inputs[1:], *output)

    @staticmethod
    def backward(ctx, g, *_):
        return (None, *ctx.decl.eager_vjp(ctx, g))
