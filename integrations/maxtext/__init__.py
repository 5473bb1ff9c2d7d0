"""moetune inside MaxText: the routed MoE layer's grouped GEMMs run on moetune.kernels, with no fork.

    from moetune.integrations import maxtext as moetune_maxtext

    moetune_maxtext.install()  # before MaxText traces its model
    ...                        # build, train or serve the MaxText model as usual

`install()` checks that the installed MaxText's MoE code is the one the plug-in knows (it raises
MaxTextNotRecognized otherwise) and replaces the grouped GEMM that MaxText's `RoutedMoE.sparse_matmul`
calls; at decode sizes the layer runs as moetune's fused decode block where moe_mlp's `decode_mode`
(install's argument) takes it, and `decisions()` says where it did and why not. `uninstall()` puts
MaxText's back, and `installed()` does both around a block. `problems` derives
the tuning problems of a MaxText config (`moetune tune --maxtext-config`). docs/maxtext.md has the
details: the MaxText settings served, the ones refused, and the versions tried.
"""

from moetune.integrations.maxtext.decode import DecodeDecision, decisions
from moetune.integrations.maxtext.hook import (
    MaxTextConfigUnsupported,
    MaxTextNotRecognized,
    install,
    installed,
    is_installed,
    uninstall,
)

__all__ = [
    "DecodeDecision",
    "MaxTextConfigUnsupported",
    "MaxTextNotRecognized",
    "decisions",
    "install",
    "installed",
    "is_installed",
    "uninstall",
]
