// The CUDA driver API, reached through libcuda.so.1 opened at run time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "device_info.h"
#include "driver_library.h"

namespace zyfa {

class CudaDriver {
public:
    static constexpr std::size_t kTensorMapBytes = 128;

    CudaDriver();  // opens the library (ZYFA_CUDA_DRIVER or libcuda.so.1) and calls cuInit

    DeviceInfo device_info(int device);
    // Loads `image` into the primary context of `device`; returns the CUfunction for `symbol`.
    std::uintptr_t load(int device, const void* image, const std::string& symbol, unsigned dynamic_shared_bytes);
    void launch(int device, std::uintptr_t function, Dim3 grid, Dim3 block, unsigned dynamic_shared_bytes,
                std::uintptr_t stream, const void* args, std::size_t args_size);
    std::array<std::uint8_t, kTensorMapBytes> encode_tensor_map(const TensorMapRequest& request);
    // (offset, size) of every parameter in the device-side layout the argument buffer must follow, or nothing
    // when the driver predates cuFuncGetParamInfo (CUDA 12.4).
    std::optional<std::vector<std::pair<std::size_t, std::size_t>>> param_layout(int device, std::uintptr_t function);

private:
    // The driver's own types, declared here so that no CUDA header is needed to build.
    using Result = int;
    using Device = int;
    using Context = void*;
    using Module = void*;
    using Function = void*;
    using Stream = void*;

    class PrimaryContextScope;

    void check(Result result, const char* call) const;
    Context primary_context(int device);

    DriverLibrary library_;
    Result (*cuInit_)(unsigned);
    Result (*cuDeviceGet_)(Device*, int);
    Result (*cuDeviceGetAttribute_)(int*, int, Device);
    Result (*cuDeviceGetName_)(char*, int, Device);
    Result (*cuDevicePrimaryCtxRetain_)(Context*, Device);
    Result (*cuCtxGetCurrent_)(Context*);
    Result (*cuCtxSetCurrent_)(Context);
    Result (*cuModuleLoadData_)(Module*, const void*);
    Result (*cuModuleGetFunction_)(Function*, Module, const char*);
    Result (*cuFuncSetAttribute_)(Function, int, int);
    Result (*cuLaunchKernel_)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Stream,
                              void**, void**);
    Result (*cuGetErrorName_)(Result, const char**);
    Result (*cuFuncGetParamInfo_)(Function, std::size_t, std::size_t*, std::size_t*);  // null: not in this driver
    Result (*cuTensorMapEncodeTiled_)(void*, int, std::uint32_t, void*, const std::uint64_t*, const std::uint64_t*,
                                      const std::uint32_t*, const std::uint32_t*, int, int, int, int);

    std::mutex contexts_mutex_;
    std::unordered_map<int, Context> primary_contexts_;  // retained once per device, kept for the process
};

}  // namespace zyfa
