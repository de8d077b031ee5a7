// What the CUDA driver calls of one small eager op cost on the host, alone and in the
// sequence gosym makes (capture query, launch, the order event's record), on the legacy
// default stream (torch's current stream unless a job picks another) and on a
// non-blocking stream: the floor under gosym's native call (gosym.callcost's "driver" row).
// Then the doorbell probe: a resident kernel taking ops by a stream write and wait instead.
// Build and run on the GPU machine: nvcc -O2 -o /tmp/driver_cost scripts/driver_cost.cu -lcuda
// (scripts/device_cuda.sh drivercost). Prints a table and, with an argument, writes JSON there.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

struct Params {  // the size of gs_ar_params (kernels/params.cuh): what a launch copies
  char bytes[280];
};

__global__ void empty(Params) {}

// The doorbell probe's server: one resident block whose thread 0 waits for the doorbell word
// to change, "runs" the op (nothing), and publishes its number in done; stop ends it. What an
// op would cost if a resident kernel took it from the caller's stream (a stream write of the
// doorbell, then a stream wait for done) instead of a launch.
__global__ void server(volatile unsigned* bell, volatile unsigned* done, unsigned stop) {
  if (threadIdx.x != 0) return;
  unsigned seen = 0;
  for (;;) {
    unsigned b;
    do {
      b = *bell;
    } while (b == seen);
    if (b == stop) return;
    seen = b;
    __threadfence_system();
    *done = b;
  }
}

#define CK(x)                                                          \
  do {                                                                 \
    CUresult r_ = (x);                                                 \
    if (r_ != CUDA_SUCCESS) {                                          \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)r_, __LINE__); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

// ns per call: the median of 7 runs of n calls; the stream is drained every 256 calls,
// outside the clock, so a launch never waits for room in the queue.
static double cost(CUstream s, int n, const std::function<void()>& f) {
  std::vector<double> runs;
  for (int rep = 0; rep < 7; rep++) {
    double ns = 0;
    for (int i = 0; i < n; i += 256) {
      CK(cuStreamSynchronize(s));
      auto t0 = std::chrono::steady_clock::now();
      for (int j = 0; j < 256; j++) f();
      ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
    runs.push_back(ns / ((n + 255) / 256 * 256));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

int main(int argc, char** argv) {
  CK(cuInit(0));
  cudaSetDevice(0);
  cudaFree(nullptr);  // the primary context, current, as torch makes it
  CUfunction fn;
  if (cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&fn), (const void*)empty) != cudaSuccess) {
    std::fprintf(stderr, "cudaGetFuncBySymbol failed\n");
    return 1;
  }
  CUstream nb;
  CK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr scratch;
  CK(cuMemAlloc(&scratch, 4));
  Params p{};
  void* args[] = {&p};
  const int n = 20000;
  std::string json = "{\n";
  std::printf("%-44s %12s %12s\n", "call", "legacy ns", "non-blocking ns");
  struct Row {
    const char* name;
    std::function<void(CUstream)> f;
  };
  std::vector<Row> rows = {
      {"cuCtxGetCurrent", [&](CUstream) { CUcontext c; CK(cuCtxGetCurrent(&c)); }},
      {"cuStreamIsCapturing", [&](CUstream s) { CUstreamCaptureStatus st; CK(cuStreamIsCapturing(s, &st)); }},
      {"cuEventRecord", [&](CUstream s) { CK(cuEventRecord(ev, s)); }},
      {"cuStreamWaitEvent", [&](CUstream s) { CK(cuStreamWaitEvent(s, ev, 0)); }},
      {"cuLaunchKernel (280 B, 1x512)", [&](CUstream s) { CK(cuLaunchKernel(fn, 1, 1, 1, 512, 1, 1, 0, s, args, nullptr)); }},
      {"cuLaunchKernel (280 B, 8x512)", [&](CUstream s) { CK(cuLaunchKernel(fn, 8, 1, 1, 512, 1, 1, 0, s, args, nullptr)); }},
      {"<<<1,512>>> (runtime)", [&](CUstream s) { empty<<<1, 512, 0, (cudaStream_t)s>>>(p); }},
      {"query + launch + record (gosym's op)", [&](CUstream s) {
         CUstreamCaptureStatus st;
         CK(cuStreamIsCapturing(s, &st));
         CK(cuLaunchKernel(fn, 1, 1, 1, 512, 1, 1, 0, s, args, nullptr));
         CK(cuEventRecord(ev, s));
       }},
      {"cuStreamWriteValue32", [&](CUstream s) { CK(cuStreamWriteValue32(s, scratch, 1, CU_STREAM_WRITE_VALUE_DEFAULT)); }},
      {"cuStreamWaitValue32 (met)", [&](CUstream s) { CK(cuStreamWaitValue32(s, scratch, 0, CU_STREAM_WAIT_VALUE_GEQ)); }},
      {"query + launch", [&](CUstream s) {
         CUstreamCaptureStatus st;
         CK(cuStreamIsCapturing(s, &st));
         CK(cuLaunchKernel(fn, 1, 1, 1, 512, 1, 1, 0, s, args, nullptr));
       }},
  };
  for (size_t i = 0; i < rows.size(); i++) {
    auto& r = rows[i];
    double legacy = cost(CU_STREAM_LEGACY, n, [&] { r.f(CU_STREAM_LEGACY); });
    double nonblocking = cost(nb, n, [&] { r.f(nb); });
    std::printf("%-44s %12.0f %12.0f\n", r.name, legacy, nonblocking);
    json += "  \"" + std::string(r.name) + "\": {\"legacy_ns\": " + std::to_string(legacy) +
            ", \"nonblocking_ns\": " + std::to_string(nonblocking) + "}" + (i + 1 < rows.size() ? ",\n" : "");
  }
  // ---- the doorbell probe: µs per op issued back to back (40, then one synchronize) and
  // alone (issue, synchronize), by launch and by doorbell ------------------------------
  CUdeviceptr words;
  CK(cuMemAlloc(&words, 8));
  CK(cuMemsetD32(words, 0, 2));
  CUdeviceptr bell = words, done = words + 4;
  CUstream ps;
  CK(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
  const unsigned stop = 0xffffffffu;
  server<<<1, 32, 0, (cudaStream_t)ps>>>((unsigned*)bell, (unsigned*)done, stop);
  unsigned seq = 0;
  auto by_launch = [&] { CK(cuLaunchKernel(fn, 1, 1, 1, 512, 1, 1, 0, nb, args, nullptr)); };
  auto by_bell = [&] {
    ++seq;
    CK(cuStreamWriteValue32(nb, bell, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
    CK(cuStreamWaitValue32(nb, done, seq, CU_STREAM_WAIT_VALUE_GEQ));
  };
  auto per_op = [&](const std::function<void()>& op, int batch, double* issue_us) {
    std::vector<double> all, iss;
    for (int rep = 0; rep < 400 / batch + 20; rep++) {
      CK(cuStreamSynchronize(nb));
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < batch; i++) op();
      auto t1 = std::chrono::steady_clock::now();
      CK(cuStreamSynchronize(nb));
      auto t2 = std::chrono::steady_clock::now();
      iss.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
      all.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / batch);
    }
    std::sort(all.begin(), all.end());
    std::sort(iss.begin(), iss.end());
    *issue_us = iss[iss.size() / 2];
    return all[all.size() / 2];
  };
  std::printf("\n%-44s %12s %12s\n", "one op (µs)", "issue", "issue..done");
  json += ",\n  \"doorbell\": {";
  const char* sep = "";
  for (int batch : {40, 1}) {
    for (int k = 0; k < 2; k++) {
      double iss;
      double whole = per_op(k ? std::function<void()>(by_bell) : std::function<void()>(by_launch), batch, &iss);
      std::string name = std::string(k ? "doorbell" : "launch") + ", " + std::to_string(batch) + " per sample";
      std::printf("%-44s %12.2f %12.2f\n", name.c_str(), iss, whole);
      json += std::string(sep) + "\"" + name + "\": {\"issue_us\": " + std::to_string(iss) + ", \"whole_us\": " + std::to_string(whole) + "}";
      sep = ", ";
    }
  }
  json += "}";
  CK(cuStreamWriteValue32(nb, bell, stop, CU_STREAM_WRITE_VALUE_DEFAULT));
  CK(cuStreamSynchronize(ps));
  json += "}\n";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
