"""``scalar_bitcast``: a scalar's bits as another scalar type of the same width, inside Numba's
compiled loops (``view``, which Numba has for arrays only). Imported only where Numba is
installed: by the compiled rounding loops (``numba_loop``) and the NumPy backend's fused
kernels (``fpsim.backend.numba_*``)."""
from __future__ import annotations

from numba.extending import intrinsic

__all__ = ["scalar_bitcast"]


def scalar_bitcast(source, target):
    """An intrinsic giving a ``source`` scalar's bits as a ``target`` scalar (Numba types of
    one width: float64 and (u)int64, float32 and (u)int32), one LLVM bitcast."""
    @intrinsic
    def cast(typingctx, value):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(source), codegen
    return cast
