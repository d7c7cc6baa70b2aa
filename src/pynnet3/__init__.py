"""pynnet3: a Python compiler, optimizer and runtime for Kaldi nnet3 networks."""

__version__ = "0.1.0"
