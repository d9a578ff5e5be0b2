// The copy/compute patterns the course teaches, as a plain CUDA C++ program
// a learner might write: what `overlap-lab trace -- ./patterns MODE` traces
// and diagnoses (no PyTorch, no Nsight). Each mode moves the same data
// through the same kernel and checks every output against the CPU.
//
//   serial       one stream: upload a batch (pinned), compute, download, next
//   pageable     the same from pageable (malloc'd) host memory
//   sync         serial with the host waiting for the stream after each batch
//   copy-stream  uploads on a stream of their own into two buffers in turn,
//                joined to the compute stream by events (serial's fix)
//   chunked      each batch in 4 chunks over 4 streams: copies overlap kernels
//
// Before issuing each batch the CPU does its own work on it (writes a
// fresh eighth of its input, the same values): what a sync in the loop
// keeps from overlapping the GPU's work.
//   threads   4 CPU threads, each running `serial` on a stream of its own
//   fork      forks before touching CUDA; parent and child each run `serial`
//   exit      runs half its batches, then exit(3) with work still queued
//   crash     runs its batches, then abort()s
//
// Build: nvcc -O2 -o patterns patterns.cu
// Usage: patterns MODE [batches (20)] [MiB per batch (32)]; prints its loop's
// wall time and how many outputs it checked.

#include <cuda_runtime.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <algorithm>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#include "work.cuh"  // the kernel, shared with the cudarc and CuPy programs

static const int ITERS = 2400;

// Every batch's host input and output (so the loop never waits to reuse a
// host buffer), and one device input and output the batches take in turn.
struct Data {
    float *host_in, *host_out, *dev_in, *dev_out;
    size_t n;  // values per batch
    int batches;
    bool pinned;
};

static Data make(size_t n, int batches, bool pinned) {
    Data d{nullptr, nullptr, nullptr, nullptr, n, batches, pinned};
    size_t bytes = n * batches * sizeof(float);
    if (pinned) {
        CHECK(cudaMallocHost(&d.host_in, bytes));
        CHECK(cudaMallocHost(&d.host_out, bytes));
    } else {
        d.host_in = (float*)malloc(bytes);
        d.host_out = (float*)malloc(bytes);
    }
    CHECK(cudaMalloc(&d.dev_in, n * sizeof(float)));
    CHECK(cudaMalloc(&d.dev_out, n * sizeof(float)));
    for (int k = 0; k < batches; ++k)
        for (size_t i = 0; i < n; ++i) {
            d.host_in[k * n + i] = (float)((i * 7 + k * 13) % 1000);
            d.host_out[k * n + i] = -1.0f;  // poisoned: a value the kernel never writes
        }
    return d;
}

// Every output against the CPU's answer; exits 2 at the first wrong one.
static long check(const Data& d) {
    for (int k = 0; k < d.batches; ++k)
        for (size_t i = 0; i < d.n; ++i) {
            float want = (float)((i * 7 + k * 13) % 1000) + 1.0f;
            if (d.host_out[k * d.n + i] != want) {
                fprintf(stderr, "batch %d: element %zu is %g, want %g\n", k, i, d.host_out[k * d.n + i], want);
                exit(2);
            }
        }
    return (long)d.n * d.batches;
}

// The CPU's own work on batch k before it is issued.
static void produce(Data& d, int k) {
    for (size_t i = 0; i < d.n / 8; ++i) d.host_in[k * d.n + i] = (float)((i * 7 + k * 13) % 1000);
}

static void launch(const float* in, float* out, size_t n, cudaStream_t s) {
    work<<<264, 256, 0, s>>>(in, out, (unsigned long long)n, ITERS, 1.0f, 0.0f);
    CHECK(cudaGetLastError());
}

// Batch k in `chunks` chunks, chunk c on streams[c % streams.size()]:
// upload, compute, download. One stream and one chunk: no overlap at all.
static void issue(Data& d, int k, const std::vector<cudaStream_t>& streams, int chunks) {
    size_t per = d.n / chunks;
    for (int c = 0; c < chunks; ++c) {
        cudaStream_t s = streams[c % streams.size()];
        size_t off = c * per, len = (c == chunks - 1) ? d.n - off : per;
        CHECK(cudaMemcpyAsync(d.dev_in + off, d.host_in + k * d.n + off, len * sizeof(float), cudaMemcpyHostToDevice, s));
        launch(d.dev_in + off, d.dev_out + off, len, s);
        CHECK(cudaMemcpyAsync(d.host_out + k * d.n + off, d.dev_out + off, len * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
}

// Runs every batch; `sync_each`: the host waits for the GPU after each
// (a sync in the loop); `stop_after`: exit(3) after issuing that batch.
// Returns the loop's wall time in ms (the host's clock, data made before).
static double run(Data& d, int streams_n, int chunks, bool sync_each, int stop_after = -1) {
    std::vector<cudaStream_t> streams(streams_n);
    for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < d.batches; ++k) {
        produce(d, k);
        issue(d, k, streams, chunks);
        if (k == stop_after) {
            fflush(stdout);
            exit(3);  // work still queued: the trace must still hold what ran
        }
        if (sync_each) CHECK(cudaStreamSynchronize(streams[0]));
    }
    CHECK(cudaDeviceSynchronize());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (auto& s : streams) CHECK(cudaStreamDestroy(s));
    return ms;
}

// Serial's fix: batch k uploaded on the copy stream into device buffer
// k % 2 once the kernel two batches back is done with it, the kernel
// waiting for its upload on the compute stream, the download after it there.
static double copy_stream(Data& d) {
    cudaStream_t copy, compute;
    CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    float* in[2] = {d.dev_in, nullptr};
    CHECK(cudaMalloc(&in[1], d.n * sizeof(float)));
    cudaEvent_t uploaded[2], consumed[2];
    for (int i = 0; i < 2; ++i) {
        CHECK(cudaEventCreateWithFlags(&uploaded[i], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&consumed[i], cudaEventDisableTiming));
    }
    size_t bytes = d.n * sizeof(float);
    CHECK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < d.batches; ++k) {
        int slot = k % 2;
        produce(d, k);
        if (k >= 2) CHECK(cudaStreamWaitEvent(copy, consumed[slot], 0));
        CHECK(cudaMemcpyAsync(in[slot], d.host_in + k * d.n, bytes, cudaMemcpyHostToDevice, copy));
        CHECK(cudaEventRecord(uploaded[slot], copy));
        CHECK(cudaStreamWaitEvent(compute, uploaded[slot], 0));
        launch(in[slot], d.dev_out, d.n, compute);
        CHECK(cudaEventRecord(consumed[slot], compute));
        CHECK(cudaMemcpyAsync(d.host_out + k * d.n, d.dev_out, bytes, cudaMemcpyDeviceToHost, compute));
    }
    CHECK(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s serial|pageable|sync|copy-stream|chunked|threads|fork|exit|crash [batches] [MiB]\n", argv[0]);
        return 64;
    }
    std::string mode = argv[1];
    int batches = argc > 2 ? atoi(argv[2]) : 20;
    size_t mib = argc > 3 ? (size_t)atoi(argv[3]) : 32;
    size_t n = mib * (1 << 20) / sizeof(float);
    long checked = 0;
    double ms = 0;
    auto serial = [&](size_t values, bool pinned, bool sync_each) {
        Data d = make(values, batches, pinned);
        ms = run(d, 1, 1, sync_each);
        checked += check(d);
    };
    if (mode == "serial") {
        serial(n, true, false);
    } else if (mode == "pageable") {
        serial(n, false, false);
    } else if (mode == "sync") {
        serial(n, true, true);
    } else if (mode == "copy-stream") {
        Data d = make(n, batches, true);
        ms = copy_stream(d);
        checked = check(d);
    } else if (mode == "chunked") {
        Data d = make(n, batches, true);
        ms = run(d, 4, 4, false);
        checked = check(d);
    } else if (mode == "threads") {
        std::vector<std::thread> ts;
        std::vector<long> got(4);
        std::vector<double> took(4);
        for (int t = 0; t < 4; ++t)
            ts.emplace_back([&, t] {
                Data d = make(n / 4, batches, true);
                took[t] = run(d, 1, 1, false);
                got[t] = check(d);
            });
        for (auto& t : ts) t.join();
        for (int t = 0; t < 4; ++t) {
            checked += got[t];
            ms = std::max(ms, took[t]);
        }
    } else if (mode == "fork") {
        pid_t child = fork();  // before any CUDA call: each process its own
        serial(n, true, false);
        if (child == 0) {
            printf("patterns fork (child %d): %ld values checked\n", getpid(), checked);
            return 0;
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "the child failed\n");
            return 1;
        }
    } else if (mode == "exit") {
        Data d = make(n, batches, true);
        run(d, 1, 1, false, batches / 2);
    } else if (mode == "crash") {
        serial(n, true, false);
        printf("patterns crash: %ld values checked; abort()\n", checked);
        fflush(stdout);
        abort();
    } else {
        fprintf(stderr, "unknown mode %s\n", mode.c_str());
        return 64;
    }
    printf("patterns %s: %d batches of %zu MiB in %.2f ms (wall), %ld values checked\n", mode.c_str(), batches, mib, ms, checked);
    return 0;
}
