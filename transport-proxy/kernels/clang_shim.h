// Only for the syntax check of kernels/producer.cu with clang (cuda.rs's test
// `kernels_parse_with_clang`): what NVRTC predefines and clang's CUDA mode, run without a
// CUDA installation (-nocudainc), lacks. Never given to NVRTC.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ __attribute__((shared))
#include "__clang_cuda_builtin_vars.h"
__device__ unsigned __ballot_sync(unsigned, int);
__device__ int __any_sync(unsigned, int);
__device__ unsigned long long __shfl_sync(unsigned, unsigned long long, int, int = 32);
__device__ int __ffs(int);
__device__ int __popc(unsigned);
__device__ int __clz(int);
__device__ unsigned atomicAdd(unsigned *, unsigned);
__device__ unsigned long long atomicAdd_system(unsigned long long *, unsigned long long);
__device__ unsigned atomicCAS(unsigned *, unsigned, unsigned);
__device__ void __threadfence_system();
__device__ void __syncthreads();
__device__ unsigned long long atomicMax(unsigned long long *, unsigned long long);
