#include "driver_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

namespace zyfa {

DriverCallFailed::DriverCallFailed(std::string call_, long long code_, std::string name_)
    : std::runtime_error(call_ + " failed with " + name_ + " (" + std::to_string(code_) + ")"),
      call(std::move(call_)),
      code(code_),
      name(std::move(name_)) {}

DriverLibrary::DriverLibrary(const char* env, const char* default_path, const char* driver_name)
    : driver_name_(driver_name) {
    const char* configured = std::getenv(env);
    path_ = (configured != nullptr && *configured != '\0') ? configured : default_path;
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
        const char* reason = dlerror();
        throw DriverMissing("the " + driver_name_ + " driver library '" + path_ + "' cannot be loaded (" +
                            (reason != nullptr ? reason : "unknown reason") + "): this needs a machine with the " +
                            driver_name_ + " driver installed, or " + env + " set to the library's path");
    }
}

void* DriverLibrary::find(const char* symbol) const {
    dlerror();
    return dlsym(handle_, symbol);
}

void* DriverLibrary::lookup(const char* symbol) const {
    void* address = find(symbol);
    if (address == nullptr) {
        throw DriverMissing("the " + driver_name_ + " driver library '" + path_ + "' has no entry point " + symbol +
                            ": the installed driver is too old or the library is not a " + driver_name_ + " driver");
    }
    return address;
}

}  // namespace zyfa
