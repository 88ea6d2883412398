// ATen only, like flash-attn kernels: no Python headers, so the object does not depend on the
// Python version (the compile cache can share it across cp311/cp313 builds).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

__global__ void relu_kernel(const float* a, float* out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] > 0.f ? a[i] : 0.f;
}

at::Tensor relu_cuda(at::Tensor a) {
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == at::kFloat && a.is_contiguous(),
              "relu: expects a contiguous float32 CUDA tensor");
  auto out = at::empty_like(a);
  int64_t n = a.numel();
  if (n == 0) return out;
  int threads = 256;
  int blocks = static_cast<int>((n + threads - 1) / threads);
  relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
