// The HIP runtime's module API, reached through libamdhip64.so opened at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "device_info.h"
#include "driver_library.h"

namespace zyfa {

class HipDriver {
public:
    HipDriver();  // opens the library (ZYFA_HIP_DRIVER or libamdhip64.so) and calls hipInit

    DeviceInfo device_info(int device);
    // Loads `image` on `device`; returns the hipFunction_t for `symbol`.
    std::uintptr_t load(int device, const void* image, const std::string& symbol);
    void launch(int device, std::uintptr_t function, Dim3 grid, Dim3 block, unsigned dynamic_shared_bytes,
                std::uintptr_t stream, const void* args, std::size_t args_size);

private:
    // The runtime's own types, declared here so that no ROCm header is needed to build.
    using Error = int;
    using Module = void*;
    using Function = void*;
    using Stream = void*;

    class DeviceScope;

    void check(Error error, const char* call) const;

    DriverLibrary library_;
    Error (*hipInit_)(unsigned);
    Error (*hipGetDevice_)(int*);
    Error (*hipSetDevice_)(int);
    Error (*hipDeviceGetAttribute_)(int*, int, int);
    Error (*hipDeviceGetName_)(char*, int, int);
    Error (*hipModuleLoadData_)(Module*, const void*);
    Error (*hipModuleGetFunction_)(Function*, Module, const char*);
    Error (*hipModuleLaunchKernel_)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    Stream, void**, void**);
    const char* (*hipGetErrorName_)(Error);
};

}  // namespace zyfa
