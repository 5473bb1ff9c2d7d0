"""moetune.integrations: plug-ins that make another framework's MoE layer call moetune's kernels.

Each plug-in is a sub-package named after the framework (maxtext/), imported only on request: importing
moetune.kernels never loads a framework.
"""
