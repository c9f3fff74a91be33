#include "cuda_driver.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace zyfa {
namespace {

// Numeric values of the driver enums used here (cuda.h, stable across CUDA 12 and 13).
constexpr int kSuccess = 0;
constexpr int kErrorInvalidValue = 1;
constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrWarpSize = 10;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrL2CacheSize = 38;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
void* const kLaunchParamEnd = reinterpret_cast<void*>(0x00);
void* const kLaunchParamBufferPointer = reinterpret_cast<void*>(0x01);
void* const kLaunchParamBufferSize = reinterpret_cast<void*>(0x02);
constexpr int kDeviceNameBytes = 256;
// cuFuncGetParamInfo reports an index past the last parameter as invalid; no kernel of ours comes near this.
constexpr std::size_t kMaxParams = 1024;

}  // namespace

// Makes the primary context of a device current (the context torch uses) and restores the caller's context.
class CudaDriver::PrimaryContextScope {
public:
    PrimaryContextScope(CudaDriver& driver, int device) : driver_(driver) {
        driver_.check(driver_.cuCtxGetCurrent_(&previous_), "cuCtxGetCurrent");
        Context wanted = driver_.primary_context(device);
        if (wanted != previous_) {
            driver_.check(driver_.cuCtxSetCurrent_(wanted), "cuCtxSetCurrent");
            switched_ = true;
        }
    }
    ~PrimaryContextScope() {
        if (switched_) driver_.cuCtxSetCurrent_(previous_);  // best effort: a destructor cannot report
    }
    PrimaryContextScope(const PrimaryContextScope&) = delete;
    PrimaryContextScope& operator=(const PrimaryContextScope&) = delete;

private:
    CudaDriver& driver_;
    Context previous_ = nullptr;
    bool switched_ = false;
};

CudaDriver::CudaDriver() : library_("ZYFA_CUDA_DRIVER", "libcuda.so.1", "CUDA") {
    library_.bind(cuInit_, "cuInit");
    library_.bind(cuDeviceGet_, "cuDeviceGet");
    library_.bind(cuDeviceGetAttribute_, "cuDeviceGetAttribute");
    library_.bind(cuDeviceGetName_, "cuDeviceGetName");
    library_.bind(cuDevicePrimaryCtxRetain_, "cuDevicePrimaryCtxRetain");
    library_.bind(cuCtxGetCurrent_, "cuCtxGetCurrent");
    library_.bind(cuCtxSetCurrent_, "cuCtxSetCurrent");
    library_.bind(cuModuleLoadData_, "cuModuleLoadData");
    library_.bind(cuModuleGetFunction_, "cuModuleGetFunction");
    library_.bind(cuFuncSetAttribute_, "cuFuncSetAttribute");
    library_.bind(cuLaunchKernel_, "cuLaunchKernel");
    library_.bind(cuGetErrorName_, "cuGetErrorName");
    library_.bind(cuTensorMapEncodeTiled_, "cuTensorMapEncodeTiled");
    library_.bind_optional(cuFuncGetParamInfo_, "cuFuncGetParamInfo");
    check(cuInit_(0), "cuInit");
}

void CudaDriver::check(Result result, const char* call) const {
    if (result == kSuccess) return;
    const char* name = nullptr;
    if (cuGetErrorName_(result, &name) != kSuccess || name == nullptr) name = "an unknown error code";
    throw DriverCallFailed(call, result, name);
}

CudaDriver::Context CudaDriver::primary_context(int device) {
    std::lock_guard<std::mutex> lock(contexts_mutex_);
    auto found = primary_contexts_.find(device);
    if (found != primary_contexts_.end()) return found->second;
    Device handle = 0;
    check(cuDeviceGet_(&handle, device), "cuDeviceGet");
    Context context = nullptr;
    check(cuDevicePrimaryCtxRetain_(&context, handle), "cuDevicePrimaryCtxRetain");
    primary_contexts_.emplace(device, context);
    return context;
}

DeviceInfo CudaDriver::device_info(int device) {
    Device handle = 0;
    check(cuDeviceGet_(&handle, device), "cuDeviceGet");
    char name[kDeviceNameBytes] = {};
    check(cuDeviceGetName_(name, kDeviceNameBytes, handle), "cuDeviceGetName");
    DeviceInfo info{name, {}};
    const std::pair<const char*, int> queries[] = {
        {"multiprocessors", kAttrMultiprocessorCount},
        {"max_shared_bytes", kAttrMaxSharedMemoryPerBlockOptin},
        {"max_threads_per_block", kAttrMaxThreadsPerBlock},
        {"warp_size", kAttrWarpSize},
        {"l2_bytes", kAttrL2CacheSize},
        {"compute_capability_major", kAttrComputeCapabilityMajor},
        {"compute_capability_minor", kAttrComputeCapabilityMinor},
    };
    for (const auto& [key, attribute] : queries) {
        int value = 0;
        check(cuDeviceGetAttribute_(&value, attribute, handle), "cuDeviceGetAttribute");
        info.attributes.emplace_back(key, value);
    }
    return info;
}

std::uintptr_t CudaDriver::load(int device, const void* image, const std::string& symbol,
                                unsigned dynamic_shared_bytes) {
    PrimaryContextScope scope(*this, device);
    Module module = nullptr;
    check(cuModuleLoadData_(&module, image), "cuModuleLoadData");
    Function function = nullptr;
    check(cuModuleGetFunction_(&function, module, symbol.c_str()), "cuModuleGetFunction");
    // Above 48 KiB a kernel must opt in to its dynamic shared memory; setting it always is harmless.
    check(cuFuncSetAttribute_(function, kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(dynamic_shared_bytes)),
          "cuFuncSetAttribute");
    return reinterpret_cast<std::uintptr_t>(function);
}

void CudaDriver::launch(int device, std::uintptr_t function, Dim3 grid, Dim3 block, unsigned dynamic_shared_bytes,
                        std::uintptr_t stream, const void* args, std::size_t args_size) {
    PrimaryContextScope scope(*this, device);
    std::size_t size = args_size;
    void* config[] = {kLaunchParamBufferPointer, const_cast<void*>(args), kLaunchParamBufferSize, &size,
                      kLaunchParamEnd};
    check(cuLaunchKernel_(reinterpret_cast<Function>(function), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                          dynamic_shared_bytes, reinterpret_cast<Stream>(stream), nullptr, config),
          "cuLaunchKernel");
}

std::optional<std::vector<std::pair<std::size_t, std::size_t>>> CudaDriver::param_layout(int device,
                                                                                         std::uintptr_t function) {
    if (cuFuncGetParamInfo_ == nullptr) return std::nullopt;
    PrimaryContextScope scope(*this, device);
    std::vector<std::pair<std::size_t, std::size_t>> layout;
    for (std::size_t index = 0; index < kMaxParams; ++index) {
        std::size_t offset = 0, size = 0;
        Result result = cuFuncGetParamInfo_(reinterpret_cast<Function>(function), index, &offset, &size);
        if (result == kErrorInvalidValue) break;
        check(result, "cuFuncGetParamInfo");
        layout.emplace_back(offset, size);
    }
    return layout;
}

std::array<std::uint8_t, CudaDriver::kTensorMapBytes> CudaDriver::encode_tensor_map(const TensorMapRequest& r) {
    struct alignas(128) TensorMap {  // the driver requires 64-byte alignment; CUDA 13 declares 128
        std::uint8_t bytes[kTensorMapBytes];
    } map{};
    check(cuTensorMapEncodeTiled_(&map, r.data_type, static_cast<std::uint32_t>(r.dims.size()), r.global_address,
                                  r.dims.data(),
                                  r.strides_bytes.data(),
                                  r.box_dims.data(), r.element_strides.data(), r.interleave, r.swizzle,
                                  r.l2_promotion, r.oob_fill),
          "cuTensorMapEncodeTiled");
    std::array<std::uint8_t, kTensorMapBytes> out{};
    std::copy(std::begin(map.bytes), std::end(map.bytes), out.begin());
    return out;
}

}  // namespace zyfa
