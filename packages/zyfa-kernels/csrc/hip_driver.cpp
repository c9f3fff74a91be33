#include "hip_driver.h"

#include <utility>

namespace zyfa {
namespace {

// Numeric values of the runtime enums used here (hip_runtime_api.h, ROCm 6 and 7).
constexpr int kSuccess = 0;
constexpr int kAttrL2CacheSize = 19;
constexpr int kAttrMaxThreadsPerBlock = 56;
constexpr int kAttrMultiprocessorCount = 63;
constexpr int kAttrMaxSharedMemoryPerBlock = 74;
constexpr int kAttrWarpSize = 87;
void* const kLaunchParamBufferPointer = reinterpret_cast<void*>(0x01);
void* const kLaunchParamBufferSize = reinterpret_cast<void*>(0x02);
void* const kLaunchParamEnd = reinterpret_cast<void*>(0x03);
constexpr int kDeviceNameBytes = 256;

}  // namespace

// Makes `device` current for the module calls and gives the caller's current device back afterwards, so that
// torch's idea of the current device is left alone.
class HipDriver::DeviceScope {
public:
    DeviceScope(HipDriver& driver, int device) : driver_(driver) {
        driver_.check(driver_.hipGetDevice_(&previous_), "hipGetDevice");
        if (previous_ != device) {
            driver_.check(driver_.hipSetDevice_(device), "hipSetDevice");
            switched_ = true;
        }
    }
    ~DeviceScope() {
        if (switched_) driver_.hipSetDevice_(previous_);  // best effort: a destructor cannot report
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

private:
    HipDriver& driver_;
    int previous_ = 0;
    bool switched_ = false;
};

HipDriver::HipDriver() : library_("ZYFA_HIP_DRIVER", "libamdhip64.so", "HIP") {
    library_.bind(hipInit_, "hipInit");
    library_.bind(hipGetDevice_, "hipGetDevice");
    library_.bind(hipSetDevice_, "hipSetDevice");
    library_.bind(hipDeviceGetAttribute_, "hipDeviceGetAttribute");
    library_.bind(hipDeviceGetName_, "hipDeviceGetName");
    library_.bind(hipModuleLoadData_, "hipModuleLoadData");
    library_.bind(hipModuleGetFunction_, "hipModuleGetFunction");
    library_.bind(hipModuleLaunchKernel_, "hipModuleLaunchKernel");
    library_.bind(hipGetErrorName_, "hipGetErrorName");
    check(hipInit_(0), "hipInit");
}

void HipDriver::check(Error error, const char* call) const {
    if (error == kSuccess) return;
    const char* name = hipGetErrorName_(error);
    throw DriverCallFailed(call, error, name != nullptr ? name : "an unknown error code");
}

DeviceInfo HipDriver::device_info(int device) {
    char name[kDeviceNameBytes] = {};
    check(hipDeviceGetName_(name, kDeviceNameBytes, device), "hipDeviceGetName");
    DeviceInfo info{name, {}};
    const std::pair<const char*, int> queries[] = {
        {"multiprocessors", kAttrMultiprocessorCount},
        {"max_shared_bytes", kAttrMaxSharedMemoryPerBlock},
        {"max_threads_per_block", kAttrMaxThreadsPerBlock},
        {"warp_size", kAttrWarpSize},
        {"l2_bytes", kAttrL2CacheSize},
    };
    for (const auto& [key, attribute] : queries) {
        int value = 0;
        check(hipDeviceGetAttribute_(&value, attribute, device), "hipDeviceGetAttribute");
        info.attributes.emplace_back(key, value);
    }
    return info;
}

std::uintptr_t HipDriver::load(int device, const void* image, const std::string& symbol) {
    DeviceScope scope(*this, device);
    Module module = nullptr;
    check(hipModuleLoadData_(&module, image), "hipModuleLoadData");
    Function function = nullptr;
    check(hipModuleGetFunction_(&function, module, symbol.c_str()), "hipModuleGetFunction");
    return reinterpret_cast<std::uintptr_t>(function);
}

void HipDriver::launch(int device, std::uintptr_t function, Dim3 grid, Dim3 block, unsigned dynamic_shared_bytes,
                       std::uintptr_t stream, const void* args, std::size_t args_size) {
    DeviceScope scope(*this, device);
    std::size_t size = args_size;
    void* config[] = {kLaunchParamBufferPointer, const_cast<void*>(args), kLaunchParamBufferSize, &size,
                      kLaunchParamEnd};
    check(hipModuleLaunchKernel_(reinterpret_cast<Function>(function), grid.x, grid.y, grid.z, block.x, block.y,
                                 block.z, dynamic_shared_bytes, reinterpret_cast<Stream>(stream), nullptr, config),
          "hipModuleLaunchKernel");
}

}  // namespace zyfa
