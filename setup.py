"""Builds the chunk-scores kernels: ``specextend_vllm._C`` (CPU, always) and
``specextend_vllm._C_cuda`` (when torch and the toolchain support CUDA)."""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

# at::parallel_for is inlined into the extension; it only runs in parallel when
# compiled against the same OpenMP runtime that torch uses.
OPENMP_FLAGS = ["-fopenmp"] if torch._C.has_openmp else []


def cpu_extension() -> CppExtension:
    return CppExtension(
        "specextend_vllm._C",
        sorted(glob.glob("csrc/cpu/*.cpp")),
        extra_compile_args=["-O3", *OPENMP_FLAGS],
        extra_link_args=OPENMP_FLAGS,
    )


def cuda_skip_reason() -> str | None:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if CUDA_HOME is None or not os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return "nvcc not found; set CUDA_HOME"
    return None


def cuda_extension() -> CUDAExtension:
    return CUDAExtension(
        "specextend_vllm._C_cuda",
        ["csrc/cuda/chunk_scores_cuda.cpp", "csrc/cuda/chunk_scores_kernel.cu"],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
    )


def ext_modules() -> list[CppExtension]:
    modules = [cpu_extension()]
    reason = cuda_skip_reason()
    if reason is None:
        modules.append(cuda_extension())
    else:
        print(f"specextend-vllm: CUDA kernel skipped ({reason})")
    return modules


setup(
    packages=find_packages(include=["specextend_vllm*"]),
    ext_modules=ext_modules(),
    cmdclass={"build_ext": BuildExtension},
)
