// The operators, registered with torch's dispatcher (TORCH_LIBRARY), not with pybind11: no
// Python headers anywhere, and a light include (8 s to compile here, torch/extension.h took 37).
// setuptools still compiles this .cpp with the interpreter's own CFLAGS, so it is the one object
// a compile cache cannot share between Python versions (docs/BENCHMARKS.md, Compile cache).
// Python reaches the ops as torch.ops.factory_example_ext.* once the library is loaded
// (see __init__.py).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

at::Tensor add_cuda(at::Tensor a, at::Tensor b);
at::Tensor scale_cuda(at::Tensor a, double s);
at::Tensor relu_cuda(at::Tensor a);
at::Tensor square_cuda(at::Tensor a);

TORCH_LIBRARY(factory_example_ext, m) {
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.def("scale(Tensor a, float s) -> Tensor");
  m.def("relu(Tensor a) -> Tensor");
  m.def("square(Tensor a) -> Tensor");
}

TORCH_LIBRARY_IMPL(factory_example_ext, CUDA, m) {
  m.impl("add", &add_cuda);
  m.impl("scale", &scale_cuda);
  m.impl("relu", &relu_cuda);
  m.impl("square", &square_cuda);
}
