"""Network-level optimization (seed 003's Grappler on nnet3 networks): passes that
rewrite an :class:`~pynnet3.Nnet` into an equivalent one before compilation,
built on the rule engine of :mod:`pynnet3.rewrite`."""

from .meta import NetworkOptions, NetworkReport, PassRecord, network_counts, optimize_network

__all__ = ["NetworkOptions", "NetworkReport", "PassRecord", "network_counts",
           "optimize_network"]
