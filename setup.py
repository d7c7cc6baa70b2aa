"""The compiled kernels (src/pynnet3/components/_kernels.c): optional. Where no C
compiler is found the build says so and pynnet3 installs without them, running the
NumPy code in their place (pynnet3.components.c_kernels). The library is plain C
with no Python module in it: c_kernels loads it with ctypes, nothing imports it."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "pynnet3.components._kernels", ["src/pynnet3/components/_kernels.c"],
    extra_compile_args=["-O3", "-fopenmp-simd", "-fno-trapping-math", "-ffp-contract=fast"],
    libraries=["m"], optional=True)])
