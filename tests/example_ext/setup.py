# A small real torch CUDA extension: the factory's bundled example and its test subject.
# Four kernel files so that build parallelism (and memory) matters; each includes torch headers.
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="factory-example-ext",
    version="0.1.0",
    packages=["factory_example_ext"],
    ext_modules=[
        CUDAExtension(
            name="factory_example_ext._C",
            sources=[
                "csrc/bindings.cpp",
                "csrc/add.cu",
                "csrc/scale.cu",
                "csrc/relu.cu",
                "csrc/square.cu",
            ],
            extra_compile_args={"cxx": ["-O2", "-std=c++20"], "nvcc": ["-O2", "-std=c++20"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
