// A stand-in for the CUDA driver (libcuda.so) that runs on a machine without a GPU, for counting
// the host instructions of a program's CUDA path (`scripts/host-cost`): "device" memory is host
// memory (allocations are `calloc`, copies are `memcpy`), streams, events and modules are empty
// handles, and kernels do nothing. Results computed through it are meaningless; the calls a
// program makes and the instructions it spends around them are its own. It is named
// `libcuda.so`, not `libcuda.so.1`: NVRTC (real, for compiling kernels) looks for the latter and
// must not find this one.
//
// With FAKE_LIBCUDA_CALLS=PATH, it writes how many times each function was called to PATH at exit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { cuInit_, cuDriverGetVersion_, cuDeviceGetCount_, cuDeviceGet_, cuDeviceGetName_, cuDeviceTotalMem_v2_, cuDevicePrimaryCtxRetain_, cuDevicePrimaryCtxRelease_v2_, cuCtxSetCurrent_, cuCtxGetCurrent_, cuCtxPushCurrent_v2_, cuCtxPopCurrent_v2_, cuCtxSynchronize_, cuCtxGetDevice_, cuCtxSetFlags_, cuCtxGetFlags_, cuStreamCreate_, cuStreamCreateWithPriority_, cuStreamDestroy_v2_, cuStreamSynchronize_, cuStreamWaitEvent_, cuStreamQuery_, cuStreamIsCapturing_, cuStreamGetCaptureInfo_v2_, cuEventCreate_, cuEventDestroy_v2_, cuEventRecord_, cuEventRecordWithFlags_, cuEventSynchronize_, cuEventQuery_, cuEventElapsedTime_, cuMemAlloc_v2_, cuMemAllocAsync_, cuMemFree_v2_, cuMemFreeAsync_, cuMemGetInfo_v2_, cuMemHostAlloc_, cuMemAllocHost_v2_, cuMemFreeHost_, cuMemHostRegister_v2_, cuMemHostUnregister_, cuMemcpyHtoD_v2_, cuMemcpyHtoDAsync_v2_, cuMemcpyDtoH_v2_, cuMemcpyDtoHAsync_v2_, cuMemcpyDtoD_v2_, cuMemcpyDtoDAsync_v2_, cuMemsetD8_v2_, cuMemsetD8Async_, cuMemsetD32Async_, cuModuleLoadData_, cuModuleLoadDataEx_, cuModuleUnload_, cuModuleGetFunction_, cuFuncGetAttribute_, cuFuncSetAttribute_, cuFuncSetCacheConfig_, cuOccupancyMaxActiveBlocksPerMultiprocessor_, cuLaunchKernel_, cuLaunchKernelEx_, cuPointerGetAttribute_, cuGetErrorString_, cuGetErrorName_, FUNCTIONS };
static const char *names[FUNCTIONS] = { "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxSynchronize", "cuCtxGetDevice", "cuCtxSetFlags", "cuCtxGetFlags", "cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent", "cuStreamQuery", "cuStreamIsCapturing", "cuStreamGetCaptureInfo_v2", "cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventRecordWithFlags", "cuEventSynchronize", "cuEventQuery", "cuEventElapsedTime", "cuMemAlloc_v2", "cuMemAllocAsync", "cuMemFree_v2", "cuMemFreeAsync", "cuMemGetInfo_v2", "cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoD_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8_v2", "cuMemsetD8Async", "cuMemsetD32Async", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleUnload", "cuModuleGetFunction", "cuFuncGetAttribute", "cuFuncSetAttribute", "cuFuncSetCacheConfig", "cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuLaunchKernel", "cuLaunchKernelEx", "cuPointerGetAttribute", "cuGetErrorString", "cuGetErrorName" };
static unsigned long long calls[FUNCTIONS];
#define CALLED(name) (calls[name##_])

__attribute__((destructor)) static void write_calls(void) {
  const char *path = getenv("FAKE_LIBCUDA_CALLS");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (!f) return;
  for (int i = 0; i < FUNCTIONS; i++)
    if (calls[i]) fprintf(f, "%s %llu\n", names[i], calls[i]);
  fclose(f);
}

static int current_ctx = 1;
static void *handle(void) { return malloc(16); }
#define OK return 0

CUresult cuInit(unsigned f) { ++CALLED(cuInit); OK; }
CUresult cuDriverGetVersion(int *v) { ++CALLED(cuDriverGetVersion); *v = 12080; OK; }
CUresult cuDeviceGetCount(int *c) { ++CALLED(cuDeviceGetCount); *c = 1; OK; }
CUresult cuDeviceGet(int *d, int o) { ++CALLED(cuDeviceGet); *d = o; OK; }
CUresult cuDeviceGetName(char *n, int len, int d) { ++CALLED(cuDeviceGetName); strncpy(n, "Fake GPU", len); OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { ++CALLED(cuDeviceTotalMem_v2); *b = 80ull << 30; OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  switch (attr) {
    case 75: *v = 9; break;  // compute capability major
    case 76: *v = 0; break;  // minor
    case 16: *v = 132; break; // multiprocessors
    case 1: *v = 1024; break; // max threads per block
    case 8: *v = 49152; break; // shared per block
    case 97: *v = 232448; break; // shared per block optin
    case 81: *v = 233472; break; // shared per multiprocessor
    case 39: *v = 2048; break; // max threads per SM
    case 10: *v = 32; break; // warp size
    default: *v = 1; break;
  }
  OK;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { ++CALLED(cuDevicePrimaryCtxRetain); *c = &current_ctx; OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { ++CALLED(cuDevicePrimaryCtxRelease_v2); OK; }
CUresult cuCtxSetCurrent(void *c) { ++CALLED(cuCtxSetCurrent); OK; }
CUresult cuCtxGetCurrent(void **c) { ++CALLED(cuCtxGetCurrent); *c = &current_ctx; OK; }
CUresult cuCtxPushCurrent_v2(void *c) { ++CALLED(cuCtxPushCurrent_v2); OK; }
CUresult cuCtxPopCurrent_v2(void **c) { ++CALLED(cuCtxPopCurrent_v2); *c = &current_ctx; OK; }
CUresult cuCtxSynchronize(void) { ++CALLED(cuCtxSynchronize); OK; }
CUresult cuCtxGetDevice(int *d) { ++CALLED(cuCtxGetDevice); *d = 0; OK; }
CUresult cuCtxSetFlags(unsigned f) { ++CALLED(cuCtxSetFlags); OK; }
CUresult cuCtxGetFlags(unsigned *f) { ++CALLED(cuCtxGetFlags); *f = 0; OK; }
CUresult cuStreamCreate(void **s, unsigned f) { ++CALLED(cuStreamCreate); *s = handle(); OK; }
CUresult cuStreamCreateWithPriority(void **s, unsigned f, int p) { ++CALLED(cuStreamCreateWithPriority); *s = handle(); OK; }
CUresult cuStreamDestroy_v2(void *s) { ++CALLED(cuStreamDestroy_v2); OK; }
CUresult cuStreamSynchronize(void *s) { ++CALLED(cuStreamSynchronize); OK; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { ++CALLED(cuStreamWaitEvent); OK; }
CUresult cuStreamQuery(void *s) { ++CALLED(cuStreamQuery); OK; }
CUresult cuStreamIsCapturing(void *s, int *st) { ++CALLED(cuStreamIsCapturing); *st = 0; OK; }
CUresult cuStreamGetCaptureInfo_v2(void *s, int *st, unsigned long long *id, void *g, void *d, size_t *n) { ++CALLED(cuStreamGetCaptureInfo_v2); *st = 0; OK; }
CUresult cuEventCreate(void **e, unsigned f) { ++CALLED(cuEventCreate); *e = handle(); OK; }
CUresult cuEventDestroy_v2(void *e) { ++CALLED(cuEventDestroy_v2); OK; }
CUresult cuEventRecord(void *e, void *s) { ++CALLED(cuEventRecord); OK; }
CUresult cuEventRecordWithFlags(void *e, void *s, unsigned f) { ++CALLED(cuEventRecordWithFlags); OK; }
CUresult cuEventSynchronize(void *e) { ++CALLED(cuEventSynchronize); OK; }
CUresult cuEventQuery(void *e) { ++CALLED(cuEventQuery); OK; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { ++CALLED(cuEventElapsedTime); *ms = 0.001f; OK; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { ++CALLED(cuMemAlloc_v2); *p = (CUdeviceptr)calloc(1, n ? n : 1); OK; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) { ++CALLED(cuMemAllocAsync); *p = (CUdeviceptr)calloc(1, n ? n : 1); OK; }
CUresult cuMemFree_v2(CUdeviceptr p) { ++CALLED(cuMemFree_v2); free((void *)p); OK; }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { ++CALLED(cuMemFreeAsync); free((void *)p); OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { ++CALLED(cuMemGetInfo_v2); *f = 70ull << 30; *t = 80ull << 30; OK; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { ++CALLED(cuMemHostAlloc); *p = malloc(n ? n : 1); OK; }
CUresult cuMemAllocHost_v2(void **p, size_t n) { ++CALLED(cuMemAllocHost_v2); *p = malloc(n ? n : 1); OK; }
CUresult cuMemFreeHost(void *p) { ++CALLED(cuMemFreeHost); free(p); OK; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { ++CALLED(cuMemHostRegister_v2); OK; }
CUresult cuMemHostUnregister(void *p) { ++CALLED(cuMemHostUnregister); OK; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { ++CALLED(cuMemcpyHtoD_v2); memcpy((void *)d, s, n); OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { ++CALLED(cuMemcpyHtoDAsync_v2); memcpy((void *)d, s, n); OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { ++CALLED(cuMemcpyDtoH_v2); memcpy(d, (void *)s, n); OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { ++CALLED(cuMemcpyDtoHAsync_v2); memcpy(d, (void *)s, n); OK; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { ++CALLED(cuMemcpyDtoD_v2); memmove((void *)d, (void *)s, n); OK; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { ++CALLED(cuMemcpyDtoDAsync_v2); memmove((void *)d, (void *)s, n); OK; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { ++CALLED(cuMemsetD8_v2); memset((void *)d, v, n); OK; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) { ++CALLED(cuMemsetD8Async); memset((void *)d, v, n); OK; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s) { ++CALLED(cuMemsetD32Async); for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v; OK; }
CUresult cuModuleLoadData(void **m, const void *img) { ++CALLED(cuModuleLoadData); *m = handle(); OK; }
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, void *o, void **v) { ++CALLED(cuModuleLoadDataEx); *m = handle(); OK; }
CUresult cuModuleUnload(void *m) { ++CALLED(cuModuleUnload); OK; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { ++CALLED(cuModuleGetFunction); *f = handle(); OK; }
CUresult cuFuncGetAttribute(int *v, int a, void *f) { ++CALLED(cuFuncGetAttribute); *v = 32; OK; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { ++CALLED(cuFuncSetAttribute); OK; }
CUresult cuFuncSetCacheConfig(void *f, int c) { ++CALLED(cuFuncSetCacheConfig); OK; }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int b, size_t s) { ++CALLED(cuOccupancyMaxActiveBlocksPerMultiprocessor); *n = 4; OK; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *s, void **p, void **e) { ++CALLED(cuLaunchKernel); OK; }
CUresult cuLaunchKernelEx(const void *c, void *f, void **p, void **e) { ++CALLED(cuLaunchKernelEx); OK; }
CUresult cuPointerGetAttribute(void *d, int a, CUdeviceptr p) { ++CALLED(cuPointerGetAttribute); memset(d, 0, 8); OK; }
CUresult cuGetErrorString(CUresult e, const char **s) { ++CALLED(cuGetErrorString); *s = "fake error"; OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { ++CALLED(cuGetErrorName); *s = "FAKE"; OK; }
