"""Builds the kernels into one module, ``specextend_vllm._C``: the CPU kernels always, the
CUDA kernels too when torch and the toolchain support CUDA."""

import glob
import os

import torch
from setuptools import Extension, find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

# at::parallel_for is inlined into the extension; it only runs in parallel when
# compiled against the same OpenMP runtime that torch uses.
OPENMP_FLAGS = ["-fopenmp"] if torch._C.has_openmp else []
# The CPU kernels are written as plain loops for the compiler to vectorize: built for this
# machine's vector ISA (AVX2, AVX-512, ...) unless SPECEXTEND_PORTABLE_BUILD=1, for binaries that
# must run on other CPUs. Their register tiles are sized for 512-bit vectors where AVX-512 is
# there; GCC's -march for AVX-512 CPUs prefers 256-bit ones, which spills those tiles (the
# prefix-attention kernel ran 1.8x slower). Without AVX-512 the preference changes nothing.
ISA_FLAGS = (
    []
    if os.environ.get("SPECEXTEND_PORTABLE_BUILD") == "1"
    else ["-march=native", "-mprefer-vector-width=512"]
)
CXX_FLAGS = ["-O3", *ISA_FLAGS, *OPENMP_FLAGS]
# csrc/bindings.cpp defines every op; csrc/<op>/ holds its kernels: cpu.cpp, and cuda.cu with
# cuda_op.cpp, its torch entry point and CUDA registration.
CPU_SOURCES = ["csrc/bindings.cpp", *sorted(glob.glob("csrc/*/cpu.cpp"))]
CUDA_SOURCES = sorted(glob.glob("csrc/*/cuda.cu") + glob.glob("csrc/*/cuda_op.cpp"))
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True))
# Sources include each other relative to csrc/; absolute, since ninja builds run elsewhere.
INCLUDE_DIRS = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")]


def cuda_skip_reason() -> str | None:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if CUDA_HOME is None or not os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return "nvcc not found; set CUDA_HOME"
    return None


def kernels_extension() -> Extension:
    reason = cuda_skip_reason()
    if reason is not None:
        print(f"specextend-vllm: CUDA kernel skipped ({reason})")
        return CppExtension(
            "specextend_vllm._C",
            CPU_SOURCES,
            include_dirs=INCLUDE_DIRS,
            depends=HEADERS,
            extra_compile_args=CXX_FLAGS,
            extra_link_args=OPENMP_FLAGS,
        )
    return CUDAExtension(
        "specextend_vllm._C",
        CPU_SOURCES + CUDA_SOURCES,
        include_dirs=INCLUDE_DIRS,
        depends=HEADERS,
        extra_compile_args={"cxx": CXX_FLAGS, "nvcc": ["-O3"]},
        extra_link_args=OPENMP_FLAGS,
    )


setup(
    packages=find_packages(include=["specextend_vllm*"]),
    ext_modules=[kernels_extension()],
    cmdclass={"build_ext": BuildExtension},
)
